from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SupervisorStatus(_message.Message):
    __slots__ = ("node_id", "server_healthy", "supervisor_instance_id", "server_instance_id", "worker_count", "busy_workers", "target", "versions", "last_error", "health_age_millis")
    class TargetEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class VersionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    SERVER_HEALTHY_FIELD_NUMBER: _ClassVar[int]
    SUPERVISOR_INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    SERVER_INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_COUNT_FIELD_NUMBER: _ClassVar[int]
    BUSY_WORKERS_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    HEALTH_AGE_MILLIS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    server_healthy: bool
    supervisor_instance_id: str
    server_instance_id: str
    worker_count: int
    busy_workers: int
    target: _containers.ScalarMap[str, str]
    versions: _containers.ScalarMap[str, str]
    last_error: str
    health_age_millis: int
    def __init__(self, node_id: _Optional[str] = ..., server_healthy: _Optional[bool] = ..., supervisor_instance_id: _Optional[str] = ..., server_instance_id: _Optional[str] = ..., worker_count: _Optional[int] = ..., busy_workers: _Optional[int] = ..., target: _Optional[_Mapping[str, str]] = ..., versions: _Optional[_Mapping[str, str]] = ..., last_error: _Optional[str] = ..., health_age_millis: _Optional[int] = ...) -> None: ...

class SupervisorAck(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SlotHello(_message.Message):
    __slots__ = ("node_id", "server_instance_id", "slot_id", "protocol_version")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    SERVER_INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    SLOT_ID_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    server_instance_id: str
    slot_id: str
    protocol_version: int
    def __init__(self, node_id: _Optional[str] = ..., server_instance_id: _Optional[str] = ..., slot_id: _Optional[str] = ..., protocol_version: _Optional[int] = ...) -> None: ...

class SlotAck(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class HttpHeader(_message.Message):
    __slots__ = ("name", "value")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    name: bytes
    value: bytes
    def __init__(self, name: _Optional[bytes] = ..., value: _Optional[bytes] = ...) -> None: ...

class RequestHead(_message.Message):
    __slots__ = ("headers", "content_length")
    HEADERS_FIELD_NUMBER: _ClassVar[int]
    CONTENT_LENGTH_FIELD_NUMBER: _ClassVar[int]
    headers: _containers.RepeatedCompositeFieldContainer[HttpHeader]
    content_length: int
    def __init__(self, headers: _Optional[_Iterable[_Union[HttpHeader, _Mapping]]] = ..., content_length: _Optional[int] = ...) -> None: ...

class ResponseHead(_message.Message):
    __slots__ = ("status", "headers")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    HEADERS_FIELD_NUMBER: _ClassVar[int]
    status: int
    headers: _containers.RepeatedCompositeFieldContainer[HttpHeader]
    def __init__(self, status: _Optional[int] = ..., headers: _Optional[_Iterable[_Union[HttpHeader, _Mapping]]] = ...) -> None: ...

class EndOfBody(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Cancel(_message.Message):
    __slots__ = ("reason",)
    REASON_FIELD_NUMBER: _ClassVar[int]
    reason: str
    def __init__(self, reason: _Optional[str] = ...) -> None: ...

class SlotFrame(_message.Message):
    __slots__ = ("request_id", "hello", "request_head", "data", "end", "response_head", "cancel", "ack")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    HELLO_FIELD_NUMBER: _ClassVar[int]
    REQUEST_HEAD_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_HEAD_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    hello: SlotHello
    request_head: RequestHead
    data: bytes
    end: EndOfBody
    response_head: ResponseHead
    cancel: Cancel
    ack: SlotAck
    def __init__(self, request_id: _Optional[str] = ..., hello: _Optional[_Union[SlotHello, _Mapping]] = ..., request_head: _Optional[_Union[RequestHead, _Mapping]] = ..., data: _Optional[bytes] = ..., end: _Optional[_Union[EndOfBody, _Mapping]] = ..., response_head: _Optional[_Union[ResponseHead, _Mapping]] = ..., cancel: _Optional[_Union[Cancel, _Mapping]] = ..., ack: _Optional[_Union[SlotAck, _Mapping]] = ...) -> None: ...
