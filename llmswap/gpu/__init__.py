"""Memory readings (NVML, host RAM, a fake for tests) and the per-model footprints built from them."""

from llmswap.gpu.fake import FakeReader
from llmswap.gpu.footprints import FOOTPRINTS_FILE, Footprint, FootprintBook
from llmswap.gpu.host import HostReader
from llmswap.gpu.nvml import NvmlReader
from llmswap.gpu.open import open_reader
from llmswap.gpu.reader import DeviceMemory, MemoryReader, device_labels, process_tree
from llmswap.gpu.units import GiB, KiB, MiB, TiB, format_bytes
from llmswap.gpu.wait import wait_for_free

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
