// Package dial connects to the assigner's leader. Assigners run as a leader and standbys;
// only the leader streams quanta and takes registrations. A connection given every
// assigner's address sends each call to the one whose health service reports
// "sliceplane.leader" as serving, and follows a failover by itself.
package dial

import (
	"errors"
	"fmt"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	_ "google.golang.org/grpc/health" // client-side health checking, which finds the leader
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
)

// LeaderHealthService is the health service name that only the leading assigner serves.
const LeaderHealthService = "sliceplane.leader"

// Leader returns a connection to whichever of the assigners at addrs leads. Calls made while
// no assigner leads fail with UNAVAILABLE, or wait with grpc.WaitForReady.
func Leader(addrs []string, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	var clean []resolver.Address
	for _, a := range addrs {
		if a = strings.TrimSpace(a); a != "" {
			clean = append(clean, resolver.Address{Addr: a})
		}
	}
	if len(clean) == 0 {
		return nil, errors.New("dial: no assigner address")
	}
	r := manual.NewBuilderWithScheme("sliceplane-assigners")
	r.InitialState(resolver.State{Addresses: clean})
	config := fmt.Sprintf(`{"loadBalancingConfig":[{"round_robin":{}}],"healthCheckConfig":{"serviceName":%q}}`, LeaderHealthService)
	opts = append([]grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithResolvers(r),
		grpc.WithDefaultServiceConfig(config),
	}, opts...)
	conn, err := grpc.NewClient(r.Scheme()+":///assigners", opts...)
	if err != nil {
		return nil, fmt.Errorf("dial: the assigners at %v: %w", addrs, err)
	}
	return conn, nil
}
