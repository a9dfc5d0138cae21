#!/bin/sh
# Issues the provider's server certificate and the autoscaler's client certificate from your
# own CA, replaces the two Secrets the component own-certificates mounts, and restarts only what
# must be: the autoscaler after a new client certificate (it reads it once, at start). The
# provider re-reads its certificate files when the Secret changes and needs no restart.
# docs/operations.md §5.4 makes the CA and says the same in commands.
#
#   renew.sh --ca-cert ca.crt --ca-key ca.key [options]
#
# Options (defaults: the kustomize base, and a Helm release named cks-autoscaler-provider):
#   -n, --namespace NS        the provider's namespace (kube-system)
#   -p, --provider NAME       the provider's Service (cks-autoscaler-provider)
#   -a, --autoscaler NAME     the autoscaler's Deployment (<provider without
#                             -autoscaler-provider>-cluster-autoscaler); its client Secret is
#                             NAME-grpc-client
#   -c, --client NAME         the client identity, DNS name and CN (the autoscaler's name)
#   -d, --cluster-domain D    the cluster's DNS domain (cluster.local)
#       --san DNS:x|IP:y      one more name of the server certificate (repeat it)
#       --server-only         only the server certificate
#       --client-only         only the client certificate
#       --no-restart          do not restart the autoscaler (it runs in another cluster)
#       --server-days N       lifetime of the server certificate (90)
#       --client-days N       lifetime of the client certificate (365)
#   -o, --out DIR             keep the issued files in DIR (else they are deleted)
#       --no-apply            issue the files only: no Secret, no restart (with --out)
#
# Needs openssl (1.1.1 or 3.x; no system openssl.cnf read) and, unless --no-apply, kubectl.
set -eu

ns=kube-system
provider=cks-autoscaler-provider
autoscaler=
client=
domain=cluster.local
ca_cert=
ca_key=
extra_sans=
do_server=1
do_client=1
restart=1
apply=1
server_days=90
client_days=365
out=

die() {
  echo "renew.sh: $*" >&2
  exit 2
}

need_value() {
  [ $# -ge 2 ] && [ -n "$2" ] || die "$1 needs a value"
}

while [ $# -gt 0 ]; do
  case $1 in
    -n | --namespace) need_value "$@"; ns=$2; shift 2 ;;
    -p | --provider) need_value "$@"; provider=$2; shift 2 ;;
    -a | --autoscaler) need_value "$@"; autoscaler=$2; shift 2 ;;
    -c | --client) need_value "$@"; client=$2; shift 2 ;;
    -d | --cluster-domain) need_value "$@"; domain=$2; shift 2 ;;
    --ca-cert) need_value "$@"; ca_cert=$2; shift 2 ;;
    --ca-key) need_value "$@"; ca_key=$2; shift 2 ;;
    --san)
      need_value "$@"
      case $2 in
        DNS:?* | IP:?*) extra_sans="$extra_sans, $2" ;;
        *) die "--san $2: write DNS:name or IP:address" ;;
      esac
      shift 2
      ;;
    --server-only) do_client=0; shift ;;
    --client-only) do_server=0; shift ;;
    --no-restart) restart=0; shift ;;
    --server-days) need_value "$@"; server_days=$2; shift 2 ;;
    --client-days) need_value "$@"; client_days=$2; shift 2 ;;
    -o | --out) need_value "$@"; out=$2; shift 2 ;;
    --no-apply) apply=0; shift ;;
    -h | --help) sed -n '2,/^set -eu/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
done

[ -n "$ca_cert" ] && [ -n "$ca_key" ] || die "--ca-cert and --ca-key are required (the CA of docs/operations.md §5.4)"
[ -r "$ca_cert" ] || die "cannot read the CA certificate $ca_cert"
[ -r "$ca_key" ] || die "cannot read the CA key $ca_key"
[ "$do_server$do_client" != 00 ] || die "--server-only and --client-only exclude each other"
[ "$apply" = 1 ] || [ -n "$out" ] || die "--no-apply issues files only: give --out DIR to keep them"
case $server_days$client_days in *[!0-9]*) die "--server-days and --client-days take a number of days" ;; esac
[ -n "$autoscaler" ] || autoscaler=${provider%-autoscaler-provider}-cluster-autoscaler
[ -n "$client" ] || client=$autoscaler
command -v openssl >/dev/null || die "openssl is not installed"
[ "$apply" = 0 ] || command -v kubectl >/dev/null || die "kubectl is not installed"

umask 077
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if [ -n "$out" ]; then
  mkdir -p "$out"
fi

# No system openssl.cnf: every request names its own config.
printf '%s\n' '[req]' 'distinguished_name = dn' 'prompt = no' '[dn]' > "$work/leaf.cnf"

# issue NAME CN DAYS EXTENSIONS...: NAME.key and NAME.crt in $work, signed by the CA.
issue() {
  name=$1 cn=$2 days=$3
  shift 3
  printf '%s\n' "$@" > "$work/$name.ext"
  openssl req -new -config "$work/leaf.cnf" -subj "/CN=$cn" \
    -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
    -keyout "$work/$name.key" -out "$work/$name.csr" 2>"$work/openssl.log" \
    || { cat "$work/openssl.log" >&2; die "openssl could not make the $name key and request"; }
  openssl x509 -req -in "$work/$name.csr" -CA "$ca_cert" -CAkey "$ca_key" \
    -set_serial "0x$(openssl rand -hex 16)" -days "$days" \
    -extfile "$work/$name.ext" -out "$work/$name.crt" 2>"$work/openssl.log" \
    || { cat "$work/openssl.log" >&2; die "openssl could not sign the $name certificate with $ca_cert"; }
  openssl verify -CAfile "$ca_cert" "$work/$name.crt" >/dev/null 2>"$work/openssl.log" \
    || { cat "$work/openssl.log" >&2; die "the new $name certificate does not chain to $ca_cert"; }
  if [ -n "$out" ]; then
    cp "$work/$name.crt" "$work/$name.key" "$out/"
    cp "$ca_cert" "$out/ca.crt"
  fi
}

# replace SECRET NAME: the Secret holds NAME's certificate and key and the CA, replaced whole.
replace() {
  kubectl -n "$ns" create secret generic "$1" \
    --from-file=tls.crt="$work/$2.crt" --from-file=tls.key="$work/$2.key" \
    --from-file=ca.crt="$ca_cert" --dry-run=client -o yaml \
    | kubectl apply --server-side --force-conflicts --field-manager=cks-renew -f -
}

if [ "$do_server" = 1 ]; then
  issue server "$provider.$ns.svc" "$server_days" \
    'basicConstraints = critical, CA:FALSE' \
    'keyUsage = critical, digitalSignature, keyEncipherment' 'extendedKeyUsage = serverAuth' \
    "subjectAltName = DNS:$provider, DNS:$provider.$ns, DNS:$provider.$ns.svc, DNS:$provider.$ns.svc.$domain, DNS:localhost$extra_sans"
  echo "server certificate for $provider ($ns): $(openssl x509 -in "$work/server.crt" -noout -enddate)"
fi
if [ "$do_client" = 1 ]; then
  issue client "$client" "$client_days" \
    'basicConstraints = critical, CA:FALSE' \
    'keyUsage = critical, digitalSignature, keyEncipherment' 'extendedKeyUsage = clientAuth' \
    "subjectAltName = DNS:$client"
  echo "client certificate for $client: $(openssl x509 -in "$work/client.crt" -noout -enddate)"
fi

[ "$apply" = 1 ] || exit 0

if [ "$do_server" = 1 ]; then
  replace "$provider-tls" server
  echo "Secret $provider-tls replaced; the provider reads it within a minute (no restart)"
fi
if [ "$do_client" = 1 ]; then
  replace "$autoscaler-grpc-client" client
  if [ "$restart" = 1 ]; then
    # New pods mount the Secret as it is now.
    if kubectl -n "$ns" get "deploy/$autoscaler" >/dev/null 2>&1; then
      kubectl -n "$ns" rollout restart "deploy/$autoscaler"
      echo "Secret $autoscaler-grpc-client replaced; autoscaler $autoscaler restarted to read it"
    else
      echo "Secret $autoscaler-grpc-client replaced; no Deployment $autoscaler in $ns to restart yet"
    fi
  else
    echo "Secret $autoscaler-grpc-client replaced; restart the autoscaler that mounts it"
  fi
fi
