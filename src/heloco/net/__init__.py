"""HeLoCo over the network: the simulator's Server and Worker behind ZeroMQ.

Modules, transport first: ``compress`` (fp32/bf16/blockwise-int8 codecs), ``pool`` (threads
for hashing and quantising), ``auth`` (secret, HMAC-SHA256 tags, replay guard), ``keys``
(CURVE key folders), ``wire`` (message framing), ``messages`` (validated message bodies),
``checkpoint`` (atomic safetensors + JSON), ``coordinator`` (a ``Server`` driven by messages),
``listener`` (one authenticating ROUTER socket), ``shards`` (a server's tensors over several
sockets), ``endpoint`` (the server's loop over its listeners), ``session`` (a served run with
metrics), ``client`` (a worker's retrying DEALER), ``link`` (a worker's hello/pull/push over
the client), ``worker_loop`` (a worker or torchrun island), ``launcher`` (local clusters).
See docs/network.md and docs/architecture.md.
"""
