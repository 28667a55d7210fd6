package client

// RelayHeartbeat is the heartbeat a router asks of a relay, for the fan-out benchmark's
// raw watchers to ask the same.
const RelayHeartbeat = relayHeartbeat
