package grpclimit_test

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/grpclimit"
	"github.com/sluicehq/sluice/memstore"
)

// One call per API key every minute: the second call fails with
// ResourceExhausted, a RetryInfo and a QuotaFailure. Install the
// interceptors with grpc.NewServer(grpc.ChainUnaryInterceptor(in.Unary()),
// grpc.ChainStreamInterceptor(in.Stream())); here the unary one is called
// directly.
func Example() {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC) // a clock the example controls
	store, err := memstore.New(memstore.Options{Now: func() time.Time { return now }})
	if err != nil {
		panic(err)
	}
	defer store.Close()
	in, err := grpclimit.New(store, grpclimit.Options{
		Policy: "orders",
		Key:    grpclimit.MetadataKey("x-api-key"),
		Limit:  sluice.Limit{Capacity: 1, Rate: sluice.Every(time.Minute)},
	})
	if err != nil {
		panic(err)
	}
	unary := in.Unary()
	info := &grpc.UnaryServerInfo{FullMethod: "/shop.Orders/Create"}
	handler := func(ctx context.Context, req any) (any, error) { return "created", nil }
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("x-api-key", "k-1"))

	for range 2 {
		resp, err := unary(ctx, nil, info, handler)
		if err == nil {
			fmt.Println(resp)
			continue
		}
		st := status.Convert(err)
		fmt.Println(st.Code(), st.Message())
		for _, d := range st.Details() {
			switch d := d.(type) {
			case *errdetails.RetryInfo:
				fmt.Println("  retry in", d.GetRetryDelay().AsDuration())
			case *errdetails.QuotaFailure:
				v := d.GetViolations()[0]
				fmt.Printf("  quota %s (%d): %s\n", v.GetQuotaId(), v.GetQuotaValue(), v.GetDescription())
			}
		}
	}
	// Output:
	// created
	// ResourceExhausted rate limit "orders" exceeded; retry after 1m0s
	//   retry in 1m0s
	//   quota orders (1): the call costs 1 and 0 of 1 remain
}
