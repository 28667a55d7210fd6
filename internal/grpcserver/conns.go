package grpcserver

import (
	"net"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// countingListener counts the connections it accepted that are still open, in a gauge: the
// number of clients a server holds, which the relay tier is to keep flat for the assigner
// however many routers there are. It counts at the socket, not with a gRPC stats handler,
// which would be called for every message of every stream.
type countingListener struct {
	net.Listener
	open prometheus.Gauge
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.open.Inc()
	return &countedConn{Conn: c, open: l.open}, nil
}

// countedConn leaves the count once, however often it is closed.
type countedConn struct {
	net.Conn
	open   prometheus.Gauge
	closed sync.Once
}

func (c *countedConn) Close() error {
	c.closed.Do(c.open.Dec)
	return c.Conn.Close()
}

// countConnections returns lis counting its open connections in
// sliceplane_<server>_connections, registered in reg (nil: counted, not registered).
func countConnections(lis net.Listener, server string, reg *prometheus.Registry) net.Listener {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: "sliceplane", Subsystem: server, Name: "connections",
		Help: "Client connections to the gRPC API that are open.",
	})
	if reg != nil {
		reg.MustRegister(g)
	}
	return countingListener{Listener: lis, open: g}
}
