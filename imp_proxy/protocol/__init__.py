"""Sans-IO PostgreSQL v3 wire protocol: framing (``framing``), typed messages (``messages``)
and their encoders/decoders (``codec``). No sockets, no asyncio."""
