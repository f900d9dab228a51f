"""plumbline's own gRPC API (proto/plumbline/v1/plumbline.proto): the read side of `plumbline serve`.

`client.PlumblineClient` is what other commands use to read from a running server; `servicer`
holds the server side. The `*_pb2*` modules are generated (see proto/README.md): do not edit them.
"""
