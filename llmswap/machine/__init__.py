"""Memory readings (NVML, host RAM, a fake for tests) and the per-model footprints built from them."""

from llmswap.machine.fake import FakeReader
from llmswap.machine.footprints import FOOTPRINTS_FILE, Footprint, FootprintBook
from llmswap.machine.host import HostReader
from llmswap.machine.nvml import NvmlReader
from llmswap.machine.open import open_reader
from llmswap.machine.reader import DeviceMemory, MemoryReader, device_labels, process_tree
from llmswap.machine.units import GiB, KiB, MiB, TiB, format_bytes
from llmswap.machine.wait import wait_for_free

__all__ = [
    "FOOTPRINTS_FILE",
    "DeviceMemory",
    "FakeReader",
    "Footprint",
    "FootprintBook",
    "GiB",
    "HostReader",
    "KiB",
    "MemoryReader",
    "MiB",
    "NvmlReader",
    "TiB",
    "device_labels",
    "format_bytes",
    "open_reader",
    "process_tree",
    "wait_for_free",
]
