"""The machine llmswap runs on: performance samples over time (`monitor`) and the hardware report
(`hardware`), served by `llmswap.server.performance_api`."""
