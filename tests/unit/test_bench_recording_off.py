"""bench/recording_cost.py's "off" side swaps every recording for `NullRecording`: it must take every call the
request path makes of a `Recording`, with the same parameters, or the "off" side answers 500 and the benchmark
stops (it did, once `waited` gained a parameter)."""

from __future__ import annotations

import inspect

from bench.recording_cost import NullRecording
from llmswap.activity.recording import Recording

# The recorder's side of a recording: it never sees a NullRecording, since `begin` is replaced as well.
RECORDER_ONLY = {"settle", "held"}


def _public(cls: type) -> dict[str, object]:
    """Its public methods and properties (a plain attribute of the null one stands for a property)."""
    return {name: member for name, member in vars(cls).items()
            if not name.startswith("_") and name not in RECORDER_ONLY
            and (inspect.isfunction(member) or isinstance(member, property)
                 or (cls is NullRecording and isinstance(member, bool)))}


def test_the_null_recording_has_every_public_member_of_a_recording() -> None:
    assert sorted(_public(NullRecording)) == sorted(_public(Recording))


def test_each_method_takes_the_same_parameters() -> None:
    for name, member in _public(Recording).items():
        if isinstance(member, property):
            assert not callable(getattr(NullRecording, name)), name
            continue
        expected = [(p.name, p.kind) for p in inspect.signature(member).parameters.values()]  # type: ignore[arg-type]
        got = [(p.name, p.kind) for p in inspect.signature(getattr(NullRecording, name)).parameters.values()]
        assert got == expected, name
