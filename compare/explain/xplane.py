"""Read an XProf trace (`*.xplane.pb`, the XSpace protobuf every XLA profiler writes) without a
framework.

compare imports no framework, and neither jax nor torch_xla ships the
XSpace message classes as a public module, so the schema (tsl/profiler/
protobuf/xplane.proto: XSpace > XPlane > XLine > XEvent, events named through
the plane's metadata map) is declared here field by field and decoded by the
protobuf library itself. Only the fields the step breakdown reads are
declared; protobuf skips the rest.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_FIELD = descriptor_pb2.FieldDescriptorProto
_INT64, _STRING, _MESSAGE = _FIELD.TYPE_INT64, _FIELD.TYPE_STRING, _FIELD.TYPE_MESSAGE
_REPEATED, _OPTIONAL = _FIELD.LABEL_REPEATED, _FIELD.LABEL_OPTIONAL

# message name -> [(field name, number, type, label, message type)]
_SCHEMA = {
    "XSpace": [
        ("planes", 1, _MESSAGE, _REPEATED, "XPlane"),
        ("hostnames", 4, _STRING, _REPEATED, None),
    ],
    "XPlane": [
        ("id", 1, _INT64, _OPTIONAL, None),
        ("name", 2, _STRING, _OPTIONAL, None),
        ("lines", 3, _MESSAGE, _REPEATED, "XLine"),
        ("event_metadata", 4, _MESSAGE, _REPEATED, "EventMetadataEntry"),
    ],
    "XLine": [
        ("id", 1, _INT64, _OPTIONAL, None),
        ("name", 2, _STRING, _OPTIONAL, None),
        ("timestamp_ns", 3, _INT64, _OPTIONAL, None),
        ("events", 4, _MESSAGE, _REPEATED, "XEvent"),
    ],
    "XEvent": [
        ("metadata_id", 1, _INT64, _OPTIONAL, None),
        ("offset_ps", 2, _INT64, _OPTIONAL, None),
        ("duration_ps", 3, _INT64, _OPTIONAL, None),
    ],
    # map<int64, XEventMetadata> is, on the wire, a repeated entry message of key 1 and value 2
    "EventMetadataEntry": [
        ("key", 1, _INT64, _OPTIONAL, None),
        ("value", 2, _MESSAGE, _OPTIONAL, "XEventMetadata"),
    ],
    "XEventMetadata": [
        ("id", 1, _INT64, _OPTIONAL, None),
        ("name", 2, _STRING, _OPTIONAL, None),
        ("display_name", 4, _STRING, _OPTIONAL, None),
    ],
}
_PACKAGE = "xla_twins.xplane"


def _space_class():
    file = descriptor_pb2.FileDescriptorProto(
        name="xla_twins_xplane.proto", package=_PACKAGE, syntax="proto3"
    )
    for name, fields in _SCHEMA.items():
        message = file.message_type.add(name=name)
        for field_name, number, kind, label, type_name in fields:
            f = message.field.add(name=field_name, number=number, type=kind, label=label)
            if type_name:
                f.type_name = f".{_PACKAGE}.{type_name}"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{_PACKAGE}.XSpace"))


_XSPACE = None


@dataclass(frozen=True)
class Event:
    plane: str
    line: str
    name: str
    start_ns: float
    end_ns: float

    @property
    def duration_ns(self) -> float:
        return self.end_ns - self.start_ns


class TraceError(ValueError):
    """A trace file that cannot be read; one line."""


def read_events(path: Path) -> list[Event]:
    """Every event of every line of every plane, in absolute nanoseconds."""
    global _XSPACE
    if _XSPACE is None:
        _XSPACE = _space_class()
    space = _XSPACE()
    try:
        space.ParseFromString(path.read_bytes())
    except Exception as e:  # protobuf's DecodeError, or a truncated file
        raise TraceError(f"{path}: not an XSpace trace ({type(e).__name__}: {e})") from None
    events = []
    for plane in space.planes:
        names = {
            entry.key: entry.value.display_name or entry.value.name
            for entry in plane.event_metadata
        }
        for line in plane.lines:
            for e in line.events:
                start = line.timestamp_ns + e.offset_ps / 1e3
                events.append(
                    Event(
                        plane.name,
                        line.name,
                        names.get(e.metadata_id, "?"),
                        start,
                        start + e.duration_ps / 1e3,
                    )
                )
    return events
