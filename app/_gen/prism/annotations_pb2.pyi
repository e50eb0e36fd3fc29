from google.protobuf import descriptor_pb2 as _descriptor_pb2
from google.protobuf import descriptor as _descriptor
from typing import ClassVar as _ClassVar

DESCRIPTOR: _descriptor.FileDescriptor
PII_FIELD_NUMBER: _ClassVar[int]
pii: _descriptor.FieldDescriptor
ENCRYPT_FIELD_NUMBER: _ClassVar[int]
encrypt: _descriptor.FieldDescriptor
INDEX_FIELD_NUMBER: _ClassVar[int]
index: _descriptor.FieldDescriptor
