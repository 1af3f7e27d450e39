"""A model server that holds real GPU memory, for the vram router's run on a real GPU (bench/gpu_vram.py).

    python -m bench.gpu_holder --hold 40GiB [-- DEMO FLAGS]

It allocates `--hold` bytes with PyTorch's CUDA allocator (plain device memory, as a model's weights are),
writes them once, then serves llmswap's demo OpenAI API from the same process, so NVML counts that memory
under this process as it would a llama-server's. Without demo flags it only holds the memory (a program
llmswap does not manage). When the memory is not there it fails as a real server does: PyTorch's "CUDA out
of memory" on stderr and a non-zero exit.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time

from llmswap.demo.main import main as serve
from llmswap.demo.sizes import parse_size


def main(argv: list[str]) -> int:
    mine, demo = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hold", type=parse_size, required=True, help="bytes of GPU memory to hold")
    options = parser.parse_args(mine)
    if options.hold == 0:  # nothing to hold: a plain demo (a dry run of bench/gpu_vram.py without a GPU)
        return serve(demo) if demo else 0
    import torch

    block = torch.empty(options.hold, dtype=torch.uint8, device="cuda")
    block.fill_(1)
    torch.cuda.synchronize()
    print(f"gpu_holder: holding {options.hold / 2**30:.2f} GiB on {torch.cuda.get_device_name()}", flush=True)
    if not demo:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        while True:
            time.sleep(3600)
    return serve(demo)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
