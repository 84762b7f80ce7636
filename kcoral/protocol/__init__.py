"""The KCoral protocol, shared by the client (which builds what it sends) and the server
(which validates what it receives), so both sides agree on one definition of each rule.

One module per concept: `strict_json` (the JSON dialect), `limits` (timeouts, output and
GPU-count ceilings), `dtypes` (tensor element types), `paths` (path rules), `program`
(instruction models and `parse_program`), `multipart` (the HTTP body framing),
`error_kind` (every error kind the protocol and its tools name) and `error_info` (the
`error` object of a FAILED outcome). Malformed input raises `kcoral.errors.WireError`.
"""
