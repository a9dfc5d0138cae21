package main

// The log phrases the harness watches, each with the package whose source logs it, and the
// check (-check-phrases, run by tests/upstream-autoscaler/run before the scenarios) that every
// one is in that package's source in the module cache, at the version this binary was built
// with, and logged at a verbosity the harness's --v shows. A phrase upstream never logs would
// make every check on it pass whatever happens.

import (
	"fmt"
	"go/ast"
	"go/build"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"unicode"
)

// Phrase is a piece of one line upstream logs (no format verb, a literal's text) and the
// import path of the package whose Go source holds it in a string literal.
type Phrase struct {
	Text, Pkg string
}

const (
	caCore         = "k8s.io/autoscaler/cluster-autoscaler/core"
	caActuation    = "k8s.io/autoscaler/cluster-autoscaler/core/scaledown/actuation"
	caOrchestrator = "k8s.io/autoscaler/cluster-autoscaler/core/scaleup/orchestrator"
	caState        = "k8s.io/autoscaler/cluster-autoscaler/clusterstate"
	caTaints       = "k8s.io/autoscaler/cluster-autoscaler/utils/taints"
	caStateUtils   = "k8s.io/autoscaler/cluster-autoscaler/clusterstate/utils"
	caExtGrpc      = "k8s.io/autoscaler/cluster-autoscaler/cloudprovider/externalgrpc"
	caSimulator    = "k8s.io/autoscaler/cluster-autoscaler/simulator"
	caPdbRule      = "k8s.io/autoscaler/cluster-autoscaler/simulator/drainability/rules/pdb"
	apiMachinery   = "k8s.io/apimachinery/pkg/util/runtime"
)

// What upstream 1.33 logs, by what it means (file and function of cluster-autoscaler unless
// said otherwise).
var (
	// apimachinery runtime.go, HandleCrash (informers and upstream's goroutines recover with it).
	phPanic = Phrase{"Observed a panic", apiMachinery}
	// static_autoscaler.go RunOnce: fixNodeGroupSize returned an error; the loop is aborted.
	phFixFailed = Phrase{"Failed to fix node group sizes", caCore}
	// static_autoscaler.go fixNodeGroupSize: it calls DecreaseTargetSize (the target stayed
	// above the registered nodes longer than max-node-provision-time).
	phDecreasing = Phrase{"Decreasing size of", caCore}
	// static_autoscaler.go RunOnce: fixNodeGroupSize acted, the rest of the loop is skipped.
	phSizeFixed = Phrase{"Some node group target size was fixed", caCore}
	// static_autoscaler.go RunOnce: Refresh failed; the loop is aborted.
	phRefreshFailed = Phrase{"Failed to refresh cloud provider config", caCore}
	// static_autoscaler.go RunOnce: IsClusterHealthy is false (too many unready nodes); the
	// rest of the loop is skipped (no deletion of failed creations, no size fix, no scaling).
	phClusterUnhealthy = Phrase{"Cluster is not ready for autoscaling", caCore}
	// static_autoscaler.go RunOnce: the template node infos failed; the loop is aborted.
	phNodeInfosFailed = Phrase{"Failed to get node infos for groups", caCore}
	// static_autoscaler.go RunOnce: the scale-up returned an error (IncreaseSize refused among
	// others: executor.go executeScaleUp wraps it in "failed to increase node group size").
	phScaleUpFailed  = Phrase{"Failed to scale up", caCore}
	phIncreaseFailed = Phrase{"failed to increase node group size", caOrchestrator}
	// executor.go executeScaleUp: IncreaseSize is called.
	phScaleUp = Phrase{"Scale-up: setting group", caOrchestrator}
	// orchestrator.go IsNodeGroupReadyToScaleUp: the group is backed off.
	phBackoff = Phrase{"is not ready for scaleup - backoff", caOrchestrator}
	// clusterstate.go backoffNodeGroup: a failed scale-up backs the group off.
	phDisabling = Phrase{"Disabling scale-up for node group", caState}
	// clusterstate.go IsNodeGroupAtTargetSize / GetUpcomingNodes: readiness not computed.
	phNoReadiness = Phrase{"Failed to find readiness information", caState}
	// node_instances_cache.go Refresh: the instance list clusterstate keeps of each group (what
	// deleteCreatedNodesWithErrors reads) is listed again; every 2 minutes, in the background.
	phInstancesRefreshed = Phrase{"Refresh cloud provider node instances cache finished", caStateUtils}
	// static_autoscaler.go deleteCreatedNodesWithErrors: failed creations are deleted, and the
	// DeleteNodes of that failed.
	phCreateErrors       = Phrase{"node group because of create errors", caCore}
	phCreateErrorsFailed = Phrase{"Error while trying to delete nodes from", caCore}
	// static_autoscaler.go removeOldUnregisteredNodes: an instance long unregistered is
	// deleted, and the DeleteNodes of that failed ("Failed to remove unregistered nodes", in
	// RunOnce and in removeOldUnregisteredNodes).
	phMarkUnregistered   = Phrase{"Marking unregistered node", caCore}
	phRemoveUnregistered = Phrase{"unregistered nodes for node group", caCore}
	phRemoveFailed       = Phrase{"Failed to remove unregistered nodes", caCore}
	// actuator.go deleteNodesAsync / StartDeletion: a scale-down of an empty node, of a
	// node with pods to drain.
	phRemovingEmpty = Phrase{"Scale-down: removing empty node", caActuation}
	phRemovingNode  = Phrase{"Scale-down: removing node", caActuation}
	// simulator/cluster.go SimulateNodeRemoval: a node's pods cannot all be moved (the
	// reason follows: a drainability rule's error), so the node is unremovable; the pdb rule's
	// error (drainability/rules/pdb/rule.go Drainable): a pod's budget allows no disruption.
	phCannotBeRemoved = Phrase{"cannot be removed", caSimulator}
	phNotEnoughPdb    = Phrase{"not enough pod disruption budget to move", caPdbRule}
	// delete_in_batch.go CleanUpAndRecordFailedScaleDownEvent: DeleteNodes (or the drain)
	// failed; the node's ToBeDeleted taint is then released.
	phDeleteEmptyFailed = Phrase{"couldn't delete empty node", caActuation}
	phDeleteNodeFailed  = Phrase{"couldn't delete node", caActuation}
	// taints.go CleanTaints: a taint is taken off a node (the line names the taint; the
	// ToBeDeleted one only after a failed deletion or at the autoscaler's start).
	phReleasingTaint = Phrase{"Releasing taint", caTaints}
	// taints.go CleanTaints: taking a taint off failed.
	phReleaseFailed = Phrase{"Error while releasing", caTaints}
	// externalgrpc_cloud_provider.go / externalgrpc_node_group.go: an RPC to the provider
	// failed (every RPC logs this, followed by its name).
	phGrpcError = Phrase{"Error on gRPC call", caExtGrpc}
)

// watched is every phrase the log watch counts.
var watched = []Phrase{
	phPanic, phFixFailed, phDecreasing, phSizeFixed, phRefreshFailed, phClusterUnhealthy,
	phNodeInfosFailed, phScaleUpFailed, phIncreaseFailed, phScaleUp, phBackoff, phDisabling,
	phNoReadiness, phInstancesRefreshed, phCreateErrors, phCreateErrorsFailed, phMarkUnregistered,
	phRemoveUnregistered, phRemoveFailed, phRemovingEmpty, phRemovingNode, phCannotBeRemoved, phNotEnoughPdb, phDeleteEmptyFailed,
	phDeleteNodeFailed, phReleasingTaint, phReleaseFailed, phGrpcError,
}

// harnessVerbosity is the --v the scenarios give the autoscaler.
func harnessVerbosity() int {
	v := 0
	for _, f := range autoscalerFlags("", "") {
		if strings.HasPrefix(f, "--v=") {
			v, _ = strconv.Atoi(strings.TrimPrefix(f, "--v="))
		}
	}
	return v
}

// checkPhrases finds every watched phrase in its package's source, in the module cache, at
// the version this binary was built with. It returns one line per phrase missing, or logged
// only at a verbosity above the harness's.
func checkPhrases() (found int, problems []string) {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return 0, []string{"no build information in this binary (build it in module mode)"}
	}
	cache := os.Getenv("GOMODCACHE")
	if cache == "" {
		out, err := exec.Command("go", "env", "GOMODCACHE").Output()
		if err != nil {
			return 0, []string{fmt.Sprintf("go env GOMODCACHE: %v", err)}
		}
		cache = strings.TrimSpace(string(out))
	}
	verbosity := harnessVerbosity()
	literals := map[string][]literal{} // package -> its string literals
	for _, ph := range watched {
		lits, ok := literals[ph.Pkg]
		if !ok {
			dir, err := packageDir(info, cache, ph.Pkg)
			if err == nil {
				lits, err = packageLiterals(dir)
			}
			if err != nil {
				problems = append(problems, fmt.Sprintf("%q: %v", ph.Text, err))
				literals[ph.Pkg] = nil
				continue
			}
			literals[ph.Pkg] = lits
		}
		best := -1 // the lowest verbosity it is logged at; -1: not found
		for _, l := range lits {
			if strings.Contains(l.text, ph.Text) && (best < 0 || l.level < best) {
				best = l.level
			}
		}
		switch {
		case best < 0:
			problems = append(problems, fmt.Sprintf("%q is in no string literal of %s", ph.Text, ph.Pkg))
		case best > verbosity:
			problems = append(problems, fmt.Sprintf("%q is logged at V(%d) only, above the harness's --v=%d", ph.Text, best, verbosity))
		default:
			found++
		}
	}
	return found, problems
}

// packageDir is where the module cache holds package pkg of the module this binary was built
// with (a replacement's, when go.mod replaces it).
func packageDir(info *debug.BuildInfo, cache, pkg string) (string, error) {
	var mod *debug.Module
	for _, m := range info.Deps {
		if (pkg == m.Path || strings.HasPrefix(pkg, m.Path+"/")) && (mod == nil || len(m.Path) > len(mod.Path)) {
			mod = m
		}
	}
	if mod == nil {
		return "", fmt.Errorf("%s: no module of this binary holds it", pkg)
	}
	sub := strings.TrimPrefix(pkg, mod.Path)
	at := mod
	if mod.Replace != nil {
		at = mod.Replace
	}
	dir := filepath.Join(cache, escapePath(at.Path)+"@"+escapePath(at.Version)) + filepath.FromSlash(sub)
	if _, err := os.Stat(dir); err != nil {
		return "", fmt.Errorf("%s@%s: not in the module cache (%v)", mod.Path, at.Version, err)
	}
	return dir, nil
}

// escapePath is the module cache's case encoding (golang.org/x/mod/module.EscapePath): an
// upper-case letter is "!" and its lower case.
func escapePath(p string) string {
	var b strings.Builder
	for _, r := range p {
		if unicode.IsUpper(r) {
			b.WriteByte('!')
			r = unicode.ToLower(r)
		}
		b.WriteRune(r)
	}
	return b.String()
}

// literal is a string literal of the source and the verbosity of the klog call it is an
// argument of: n for klog.V(n).…, 0 for klog.Info… / Warning… / Error… and for a literal
// that is not a logging call's own argument (an error text or a format kept in a variable:
// it reaches the log through another line, which the harness logs at any --v).
type literal struct {
	text  string
	level int
}

// packageLiterals parses the package's Go files as the harness builds them (tag
// externalgrpc, no tests) and returns their string literals.
func packageLiterals(dir string) ([]literal, error) {
	ctx := build.Default
	ctx.BuildTags = []string{"externalgrpc"}
	bp, err := ctx.ImportDir(dir, 0)
	if err != nil {
		return nil, err
	}
	var out []literal
	fset := token.NewFileSet()
	for _, name := range append(bp.GoFiles, bp.CgoFiles...) {
		f, err := parser.ParseFile(fset, filepath.Join(dir, name), nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, err
		}
		var stack []ast.Node
		ast.Inspect(f, func(n ast.Node) bool {
			if n == nil {
				stack = stack[:len(stack)-1]
				return true
			}
			stack = append(stack, n)
			lit, ok := n.(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			s, err := strconv.Unquote(lit.Value)
			if err != nil {
				return true
			}
			out = append(out, literal{text: s, level: verbosityOf(stack)})
			return true
		})
	}
	return out, nil
}

// verbosityOf is the n of the innermost call x.V(n).F(…) that the node on top of stack is an
// argument of, or 0.
func verbosityOf(stack []ast.Node) int {
	for i := len(stack) - 2; i >= 0; i-- {
		call, ok := stack[i].(*ast.CallExpr)
		if !ok {
			continue
		}
		sel, ok := call.Fun.(*ast.SelectorExpr)
		if !ok {
			continue
		}
		vcall, ok := sel.X.(*ast.CallExpr)
		if !ok {
			return 0
		}
		vsel, ok := vcall.Fun.(*ast.SelectorExpr)
		if !ok || vsel.Sel.Name != "V" || len(vcall.Args) != 1 {
			return 0
		}
		if n, ok := vcall.Args[0].(*ast.BasicLit); ok && n.Kind == token.INT {
			v, _ := strconv.Atoi(n.Value)
			return v
		}
		return 0
	}
	return 0
}
