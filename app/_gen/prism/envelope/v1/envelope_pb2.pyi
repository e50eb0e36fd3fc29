from google.protobuf import any_pb2 as _any_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ContentType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CONTENT_TYPE_UNSPECIFIED: _ClassVar[ContentType]
    CONTENT_TYPE_PROTOBUF: _ClassVar[ContentType]
    CONTENT_TYPE_JSON: _ClassVar[ContentType]
    CONTENT_TYPE_AVRO: _ClassVar[ContentType]
    CONTENT_TYPE_CUSTOM: _ClassVar[ContentType]

class ContentEncoding(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CONTENT_ENCODING_NONE: _ClassVar[ContentEncoding]
    CONTENT_ENCODING_GZIP: _ClassVar[ContentEncoding]
    CONTENT_ENCODING_SNAPPY: _ClassVar[ContentEncoding]
    CONTENT_ENCODING_ZSTD: _ClassVar[ContentEncoding]
    CONTENT_ENCODING_CUSTOM: _ClassVar[ContentEncoding]

class SignatureScope(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SIGNATURE_SCOPE_LEGACY: _ClassVar[SignatureScope]
    SIGNATURE_SCOPE_V2: _ClassVar[SignatureScope]
    SIGNATURE_SCOPE_PAIR: _ClassVar[SignatureScope]
    SIGNATURE_SCOPE_BATCH: _ClassVar[SignatureScope]

class EncryptionType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ENCRYPTION_TYPE_UNSPECIFIED: _ClassVar[EncryptionType]
    ENCRYPTION_TYPE_SYMMETRIC: _ClassVar[EncryptionType]
    ENCRYPTION_TYPE_ASYMMETRIC: _ClassVar[EncryptionType]
    ENCRYPTION_TYPE_POST_QUANTUM: _ClassVar[EncryptionType]
    ENCRYPTION_TYPE_HYBRID: _ClassVar[EncryptionType]
CONTENT_TYPE_UNSPECIFIED: ContentType
CONTENT_TYPE_PROTOBUF: ContentType
CONTENT_TYPE_JSON: ContentType
CONTENT_TYPE_AVRO: ContentType
CONTENT_TYPE_CUSTOM: ContentType
CONTENT_ENCODING_NONE: ContentEncoding
CONTENT_ENCODING_GZIP: ContentEncoding
CONTENT_ENCODING_SNAPPY: ContentEncoding
CONTENT_ENCODING_ZSTD: ContentEncoding
CONTENT_ENCODING_CUSTOM: ContentEncoding
SIGNATURE_SCOPE_LEGACY: SignatureScope
SIGNATURE_SCOPE_V2: SignatureScope
SIGNATURE_SCOPE_PAIR: SignatureScope
SIGNATURE_SCOPE_BATCH: SignatureScope
ENCRYPTION_TYPE_UNSPECIFIED: EncryptionType
ENCRYPTION_TYPE_SYMMETRIC: EncryptionType
ENCRYPTION_TYPE_ASYMMETRIC: EncryptionType
ENCRYPTION_TYPE_POST_QUANTUM: EncryptionType
ENCRYPTION_TYPE_HYBRID: EncryptionType

class PrismEnvelope(_message.Message):
    __slots__ = ("metadata", "security", "observability", "schema", "extensions", "payload")
    class ExtensionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: bytes
        def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...
    METADATA_FIELD_NUMBER: _ClassVar[int]
    SECURITY_FIELD_NUMBER: _ClassVar[int]
    OBSERVABILITY_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_FIELD_NUMBER: _ClassVar[int]
    EXTENSIONS_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    metadata: PrismMetadata
    security: SecurityContext
    observability: ObservabilityContext
    schema: SchemaContext
    extensions: _containers.ScalarMap[str, bytes]
    payload: _any_pb2.Any
    def __init__(self, metadata: _Optional[_Union[PrismMetadata, _Mapping]] = ..., security: _Optional[_Union[SecurityContext, _Mapping]] = ..., observability: _Optional[_Union[ObservabilityContext, _Mapping]] = ..., schema: _Optional[_Union[SchemaContext, _Mapping]] = ..., extensions: _Optional[_Mapping[str, bytes]] = ..., payload: _Optional[_Union[_any_pb2.Any, _Mapping]] = ...) -> None: ...

class PrismMetadata(_message.Message):
    __slots__ = ("message_id", "topic", "namespace", "published_at_ms", "content_type", "priority", "ttl_seconds", "content_encoding", "correlation_id", "causality_parent", "content_type_custom", "content_encoding_custom", "producer_sdk_version")
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    PUBLISHED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    CONTENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    CONTENT_ENCODING_FIELD_NUMBER: _ClassVar[int]
    CORRELATION_ID_FIELD_NUMBER: _ClassVar[int]
    CAUSALITY_PARENT_FIELD_NUMBER: _ClassVar[int]
    CONTENT_TYPE_CUSTOM_FIELD_NUMBER: _ClassVar[int]
    CONTENT_ENCODING_CUSTOM_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_SDK_VERSION_FIELD_NUMBER: _ClassVar[int]
    message_id: str
    topic: str
    namespace: str
    published_at_ms: int
    content_type: ContentType
    priority: int
    ttl_seconds: int
    content_encoding: ContentEncoding
    correlation_id: str
    causality_parent: str
    content_type_custom: str
    content_encoding_custom: str
    producer_sdk_version: str
    def __init__(self, message_id: _Optional[str] = ..., topic: _Optional[str] = ..., namespace: _Optional[str] = ..., published_at_ms: _Optional[int] = ..., content_type: _Optional[_Union[ContentType, str]] = ..., priority: _Optional[int] = ..., ttl_seconds: _Optional[int] = ..., content_encoding: _Optional[_Union[ContentEncoding, str]] = ..., correlation_id: _Optional[str] = ..., causality_parent: _Optional[str] = ..., content_type_custom: _Optional[str] = ..., content_encoding_custom: _Optional[str] = ..., producer_sdk_version: _Optional[str] = ...) -> None: ...

class SecurityContext(_message.Message):
    __slots__ = ("publisher_id", "publisher_team", "auth_token", "signature", "signature_algorithm", "encryption", "contains_pii", "data_classification", "signature_key_id", "signature_scope", "sibling_digest", "tree_index", "tree_size", "tree_path")
    PUBLISHER_ID_FIELD_NUMBER: _ClassVar[int]
    PUBLISHER_TEAM_FIELD_NUMBER: _ClassVar[int]
    AUTH_TOKEN_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_ALGORITHM_FIELD_NUMBER: _ClassVar[int]
    ENCRYPTION_FIELD_NUMBER: _ClassVar[int]
    CONTAINS_PII_FIELD_NUMBER: _ClassVar[int]
    DATA_CLASSIFICATION_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_KEY_ID_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_SCOPE_FIELD_NUMBER: _ClassVar[int]
    SIBLING_DIGEST_FIELD_NUMBER: _ClassVar[int]
    TREE_INDEX_FIELD_NUMBER: _ClassVar[int]
    TREE_SIZE_FIELD_NUMBER: _ClassVar[int]
    TREE_PATH_FIELD_NUMBER: _ClassVar[int]
    publisher_id: str
    publisher_team: str
    auth_token: str
    signature: bytes
    signature_algorithm: str
    encryption: EncryptionMetadata
    contains_pii: bool
    data_classification: str
    signature_key_id: str
    signature_scope: SignatureScope
    sibling_digest: bytes
    tree_index: int
    tree_size: int
    tree_path: bytes
    def __init__(self, publisher_id: _Optional[str] = ..., publisher_team: _Optional[str] = ..., auth_token: _Optional[str] = ..., signature: _Optional[bytes] = ..., signature_algorithm: _Optional[str] = ..., encryption: _Optional[_Union[EncryptionMetadata, _Mapping]] = ..., contains_pii: _Optional[bool] = ..., data_classification: _Optional[str] = ..., signature_key_id: _Optional[str] = ..., signature_scope: _Optional[_Union[SignatureScope, str]] = ..., sibling_digest: _Optional[bytes] = ..., tree_index: _Optional[int] = ..., tree_size: _Optional[int] = ..., tree_path: _Optional[bytes] = ...) -> None: ...

class EncryptionMetadata(_message.Message):
    __slots__ = ("key_id", "encryption_type", "algorithm", "public_key_id", "iv", "aad", "encapsulated_key", "algorithm_params")
    KEY_ID_FIELD_NUMBER: _ClassVar[int]
    ENCRYPTION_TYPE_FIELD_NUMBER: _ClassVar[int]
    ALGORITHM_FIELD_NUMBER: _ClassVar[int]
    PUBLIC_KEY_ID_FIELD_NUMBER: _ClassVar[int]
    IV_FIELD_NUMBER: _ClassVar[int]
    AAD_FIELD_NUMBER: _ClassVar[int]
    ENCAPSULATED_KEY_FIELD_NUMBER: _ClassVar[int]
    ALGORITHM_PARAMS_FIELD_NUMBER: _ClassVar[int]
    key_id: str
    encryption_type: EncryptionType
    algorithm: str
    public_key_id: str
    iv: bytes
    aad: bytes
    encapsulated_key: bytes
    algorithm_params: str
    def __init__(self, key_id: _Optional[str] = ..., encryption_type: _Optional[_Union[EncryptionType, str]] = ..., algorithm: _Optional[str] = ..., public_key_id: _Optional[str] = ..., iv: _Optional[bytes] = ..., aad: _Optional[bytes] = ..., encapsulated_key: _Optional[bytes] = ..., algorithm_params: _Optional[str] = ...) -> None: ...

class ObservabilityContext(_message.Message):
    __slots__ = ("trace_id", "span_id", "parent_span_id", "trace_flags", "baggage", "labels")
    class BaggageEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TRACE_ID_FIELD_NUMBER: _ClassVar[int]
    SPAN_ID_FIELD_NUMBER: _ClassVar[int]
    PARENT_SPAN_ID_FIELD_NUMBER: _ClassVar[int]
    TRACE_FLAGS_FIELD_NUMBER: _ClassVar[int]
    BAGGAGE_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    trace_id: str
    span_id: str
    parent_span_id: str
    trace_flags: int
    baggage: _containers.ScalarMap[str, str]
    labels: _containers.ScalarMap[str, str]
    def __init__(self, trace_id: _Optional[str] = ..., span_id: _Optional[str] = ..., parent_span_id: _Optional[str] = ..., trace_flags: _Optional[int] = ..., baggage: _Optional[_Mapping[str, str]] = ..., labels: _Optional[_Mapping[str, str]] = ...) -> None: ...

class SchemaContext(_message.Message):
    __slots__ = ("schema_url", "schema_version", "schema_format", "schema_hash", "schema_name", "compatibility_mode", "deprecated_fields_used")
    SCHEMA_URL_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_VERSION_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_FORMAT_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_HASH_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_NAME_FIELD_NUMBER: _ClassVar[int]
    COMPATIBILITY_MODE_FIELD_NUMBER: _ClassVar[int]
    DEPRECATED_FIELDS_USED_FIELD_NUMBER: _ClassVar[int]
    schema_url: str
    schema_version: str
    schema_format: str
    schema_hash: str
    schema_name: str
    compatibility_mode: str
    deprecated_fields_used: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, schema_url: _Optional[str] = ..., schema_version: _Optional[str] = ..., schema_format: _Optional[str] = ..., schema_hash: _Optional[str] = ..., schema_name: _Optional[str] = ..., compatibility_mode: _Optional[str] = ..., deprecated_fields_used: _Optional[_Iterable[str]] = ...) -> None: ...
