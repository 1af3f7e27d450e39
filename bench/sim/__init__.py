"""The scheduling simulator: a virtual clock, simulated processes, the production schedulers."""
