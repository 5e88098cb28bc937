"""The one streaming client both real-engine adapters use, in three rooms.

- `adapters.client.http`: where a server is and how to talk to it: the
  endpoint, the timeouts, one-shot GETs, opening a connection, writing a
  request, and the I/O errors that the other two rooms turn into data.
- `adapters.client.stream`: one streamed completion: the request body, reading
  and parsing the server-sent events, one time per output token, and one typed
  `StreamOutcome` per request that carries ``success``/``error`` instead of
  raising (the shape of vLLM's ``benchmarks/lib/endpoint_request_func.py``).
- `adapters.client.dispatch`: the open-loop replay of a whole `Workload`: the
  arrival schedule, connections opened just before each arrival, the send at
  the arrival instant (its lag recorded), and one `RequestRecord` per request.

Data flows one way: dispatch uses stream, stream uses http.
"""
