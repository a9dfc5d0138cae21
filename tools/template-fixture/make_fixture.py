#!/usr/bin/env python3
"""Encode the expected template Nodes of tests/fixtures/template/*.json as Kubernetes protobuf.

Each JSON file describes one case: the inputs of `build_template_node` ("input", "settings")
and, written out by hand, the Node a new worker should be ("expected_node", in the proto JSON
mapping of k8s.io/api/core/v1 Node). This script encodes "expected_node" with Python's protobuf
library from the .proto subset under proto/ (upstream field numbers) and writes <case>.bin next
to the JSON. tests/it/template_fixture.rs then checks the Rust encoder against these bytes, so the
Rust test needs no Python.

The script also recomputes the expected node name from "input" with its own FNV-1a (the naming
rule documented in src/template/node.rs) and refuses a JSON whose name disagrees, so the fixture's
name is not copied from the Rust output.

Usage (development only):
    python3 -m venv /tmp/fixture-venv
    /tmp/fixture-venv/bin/pip install grpcio-tools protobuf
    /tmp/fixture-venv/bin/python tools/template-fixture/make_fixture.py
"""

import json
import pathlib
import struct
import sys
import tempfile

from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory
from grpc_tools import protoc

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent.parent
FIXTURES = REPO / "tests" / "fixtures" / "template"
PROTO_ROOT = HERE / "proto"
PROTOS = [
    "k8s.io/apimachinery/pkg/api/resource/generated.proto",
    "k8s.io/apimachinery/pkg/apis/meta/v1/generated.proto",
    "k8s.io/api/core/v1/generated.proto",
]


def compile_protos(out_dir):
    """Compile the proto subset into a descriptor set and return the Node message class."""
    fds_path = pathlib.Path(out_dir) / "node.fds"
    args = [
        "protoc",
        f"-I{PROTO_ROOT}",
        "--include_imports",
        f"--descriptor_set_out={fds_path}",
    ] + PROTOS
    if protoc.main(args) != 0:
        sys.exit("protoc failed")
    fds = descriptor_pb2.FileDescriptorSet.FromString(fds_path.read_bytes())
    pool = descriptor_pool.DescriptorPool()
    for file_proto in fds.file:
        pool.Add(file_proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("k8s.io.api.core.v1.Node"))


class Fnv1a:
    """64-bit FNV-1a with the field framing src/template/node.rs uses for template names."""

    def __init__(self):
        self.h = 0xCBF29CE484222325

    def write(self, data):
        for b in data:
            self.h ^= b
            self.h = (self.h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF

    def write_str(self, s):
        self.write(s.encode("utf-8"))
        self.write(b"\xff")

    def write_u64(self, v):
        self.write(struct.pack("<Q", v))


def template_name(inp):
    h = Fnv1a()
    h.write_str(inp["group_id"])
    h.write_str(inp["offering_name"])
    h.write_u64(inp["cpus"])
    h.write_u64(inp["memory_mib"])
    h.write_u64(inp["root_disk_gib"] or 0)
    h.write_str(inp["zone_name"])
    h.write_str(inp["arch"])
    gpu = inp.get("gpu")
    if gpu:
        h.write_str(gpu["resource_name"])
        h.write_u64(gpu["count"])
        h.write_str(gpu["gpu_type"])
    folded = (h.h >> 32) ^ (h.h & 0xFFFFFFFF)
    return f"template-node-for-{inp['group_id']}-{folded:08x}"


def main():
    cases = sorted(FIXTURES.glob("*.json"))
    if not cases:
        sys.exit(f"no fixtures in {FIXTURES}")
    with tempfile.TemporaryDirectory() as out:
        node_cls = compile_protos(out)
        for path in cases:
            case = json.loads(path.read_text())
            expected = case["expected_node"]
            want_name = template_name(case["input"])
            meta = expected["metadata"]
            if meta["name"] != want_name or meta["labels"]["kubernetes.io/hostname"] != want_name:
                sys.exit(f"{path.name}: node name/hostname label must be {want_name}")
            node = json_format.ParseDict(expected, node_cls())
            data = node.SerializeToString(deterministic=True)
            path.with_suffix(".bin").write_bytes(data)
            print(f"{path.with_suffix('.bin').name}: {len(data)} bytes")


if __name__ == "__main__":
    main()
