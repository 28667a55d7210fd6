package dial

// ServerOptionsPinging is ServerOptions with a server that pings a silent client after ping
// and waits wait for its answer, for a test that cannot wait out the real ones.
var ServerOptionsPinging = serverOptions
