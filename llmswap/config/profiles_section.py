"""`profiles:`: named sets of pins, one of which may be active at a time (switched over the API).

A pin maps a name clients send to a target: a model id, an alias, a peer model or a selector id. A pin
to null or "" disables the name while its profile is active. Pins do not chain: a target that is only
another pin's name is unknown. A pin name may shadow a model, an alias or a selector, but not a fully
qualified peer model name (llama-swap's rules).
"""

from __future__ import annotations

from collections.abc import Collection
from types import MappingProxyType

from llmswap.config import keys
from llmswap.config.fields import Fields
from llmswap.config.model import ProfileConfig
from llmswap.config.selectors_section import Names
from llmswap.config.yamltree import Map, Scalar, Seq, describe


def read_profiles(root: Fields, names: Names, selector_ids: Collection[str]) -> dict[str, ProfileConfig]:
    section = root.mapping("profiles", "a mapping of profile names to profiles")
    profiles: dict[str, ProfileConfig] = {}
    for profile_id in section.names():
        node = section.map.entries[profile_id].node
        if not profile_id.strip():
            section.error(profile_id, "profiles: profile names cannot be empty; give the profile a name")
            continue
        if isinstance(node, Seq):
            section.error(
                profile_id,
                "profile must be a mapping with description and pins; the legacy list syntax is no longer "
                "supported: write pins: {<name>: <model>}",
            )
            continue
        fields = section.mapping(profile_id, "a mapping with description: and pins:")
        if not isinstance(node, Map):
            continue
        fields.warn_unknown(keys.PROFILE)
        pins_fields = fields.mapping("pins", "a mapping of requested names to models")
        pins: dict[str, str] = {}
        ok = True
        for pin in pins_fields.names():
            line, where = pins_fields.line(pin), pins_fields.path_of(pin)
            if not pin.strip():
                fields.problems.error(line, where, "pins: pin names cannot be empty; remove the entry")
                ok = False
                continue
            if names.is_peer_fqn(pin):
                fields.problems.error(
                    line, where,
                    f'profile {profile_id} pin "{pin}" conflicts with fully qualified peer model name; '
                    "pin a different name",
                )
                ok = False
                continue
            value = pins_fields.map.entries[pin].node
            if not isinstance(value, Scalar):
                fields.problems.error(line, where, f"must be a model name, or null to disable {pin}; "
                                      f"got {describe(value)}")
                ok = False
                continue
            target = "" if value.value is None else value.text.strip()
            if target and target not in selector_ids and names.local(target) is None \
                    and names.peer(target) is None:
                fields.problems.error(
                    line, where,
                    f'references unknown model "{target}"; pin a model id, an alias, a peer model or a '
                    "selector (pins do not chain)",
                )
                ok = False
                continue
            pins[pin] = target
        if not pins and ok:
            fields.error("pins" if "pins" in fields.map.entries else None,
                         "pins must contain at least one entry; pin a name to a model")
            continue
        if not ok:
            continue
        profiles[profile_id] = ProfileConfig(
            id=profile_id, description=fields.text("description").strip(), pins=MappingProxyType(pins)
        )
    return profiles
