"""HeLoCo over the network: the simulator's Server and Worker behind ZeroMQ.

Modules, transport first: ``compress`` (fp32/bf16/blockwise-int8 codecs), ``auth`` (secret,
HMAC-SHA256 tags, replay guard), ``wire`` (message framing), ``checkpoint`` (atomic
safetensors + JSON), ``coordinator`` (a ``Server`` driven by messages), ``endpoint`` (the
server's ROUTER loop), ``client`` (a worker's retrying DEALER), ``build`` (server/worker from a
run config, as the simulator builds them), ``session`` (a served run with metrics),
``worker_loop`` (a worker or torchrun island), ``launcher`` (local clusters). See
docs/network.md.
"""
