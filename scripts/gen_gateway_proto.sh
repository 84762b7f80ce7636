#!/usr/bin/env bash
# Regenerate kcoral_server/gateway/kcoral_gateway_pb2.py from kcoral_gateway.proto
# (needs `pip install grpcio-tools`; the generated module needs only protobuf at run time).
set -euo pipefail
cd "$(dirname "$0")/../kcoral_server/gateway"
python -m grpc_tools.protoc -I. --python_out=. --pyi_out=. kcoral_gateway.proto
