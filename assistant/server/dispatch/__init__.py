"""``assistant dispatch``: one front for several gateways (each an ``assistant serve`` with a ``server.gateway_id``).

Only signaling passes through here: a gateway's SDP answer carries its own ICE candidates, so the media of a
session flows between the browser and that gateway, and no load-balancer stickiness is needed.

- ``POST /api/offer``, ``POST /api/whip``: the ready gateway with the most free slots (ties: fewest sessions, then
  round robin) gets the offer. A ``503`` (``busy``, ``not_ready``) or a connection that fails moves it to the next
  one; each gateway is tried at most once per offer. The chosen gateway's session count goes up at once, so a burst
  of offers spreads before the next heartbeat.
- ``PATCH``/``DELETE /api/sessions/{id}``: the gateway named by the id's prefix (``gA.<token>``).
- ``GET /api/sessions``: every gateway's list, merged.
- Any other ``GET /api/*``, ``POST /api/tts``, ``/v1/*``: one ready gateway, the answer streamed back;
  ``/ws/*``: a WebSocket proxied both ways.
- ``GET /readyz`` (ready while one gateway is), ``/healthz``, ``/metrics``, and the page.

Which of these a route gets is its ``Forward`` kind in the one route table (``server/routes.py``), so a route added
to the server is forwarded by the dispatcher without a second list.

    gateways.py   the gateway table, the heartbeat, the HTTP client that only reaches gateways
    forward.py    one handler per kind of forwarding
    app.py        the dispatcher's aiohttp app, built from the route table

It needs no Ray, and imports nothing of the voice session or the TTS API: only the shared server pieces.

"""
