"""The synchronous Peregrine task library: a TaskScheduler on a thread of its own, batched by type
under VRAM budgets."""
