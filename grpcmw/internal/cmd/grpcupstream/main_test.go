package main

import (
	"context"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/ratewindow/ratewindow/internal/strictup"
)

// The strict upstream refuses the call over its limit with
// RESOURCE_EXHAUSTED and a RetryInfo within a second.
func TestStrictHealthRefuses(t *testing.T) {
	h := strictHealth{log: strictup.New(1)}
	if _, err := h.Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("the first call: %v", err)
	}
	_, err := h.Check(context.Background(), &healthpb.HealthCheckRequest{})
	st := status.Convert(err)
	if st.Code() != codes.ResourceExhausted {
		t.Fatalf("the second call: %v; want RESOURCE_EXHAUSTED", err)
	}
	var retry time.Duration
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			retry = ri.GetRetryDelay().AsDuration()
		}
	}
	if retry <= 0 || retry > time.Second {
		t.Fatalf("RetryInfo's delay %s; want within (0, 1s]", retry)
	}
}
