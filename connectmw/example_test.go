package connectmw_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratewindow/ratewindow/connectmw"
	"github.com/ratewindow/ratewindow/core"
)

// A Connect service limited to one call a minute per client IP: the second
// call is denied with resource_exhausted, a RetryInfo detail and
// Retry-After, and a plain HTTP caller of the same mux gets 429.
func Example() {
	l := core.NewMemory() // core.New(redisClient) shares the counts across replicas
	mux := http.NewServeMux()
	mux.Handle("/greet.v1.GreetService/Greet", connect.NewUnaryHandler("/greet.v1.GreetService/Greet",
		func(_ context.Context, req *connect.Request[wrapperspb.StringValue]) (*connect.Response[wrapperspb.StringValue], error) {
			return connect.NewResponse(wrapperspb.String("hello " + req.Msg.GetValue())), nil
		}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "ok") })
	limit := connectmw.Limit(l, core.Rule{Name: "api", Limits: []core.Limit{core.PerMinute(1)}})
	srv := httptest.NewServer(limit(mux))
	defer srv.Close()

	client := connect.NewClient[wrapperspb.StringValue, wrapperspb.StringValue](srv.Client(), srv.URL+"/greet.v1.GreetService/Greet")
	for range 2 {
		resp, err := client.CallUnary(context.Background(), connect.NewRequest(wrapperspb.String("ada")))
		if err == nil {
			fmt.Println(resp.Msg.GetValue())
			continue
		}
		var cerr *connect.Error
		if errors.As(err, &cerr) {
			fmt.Println(cerr.Code(), "Retry-After:", cerr.Meta().Get("Retry-After"))
			for _, d := range cerr.Details() {
				if v, err := d.Value(); err == nil {
					if ri, ok := v.(*errdetails.RetryInfo); ok {
						fmt.Println("RetryInfo within a minute:", ri.GetRetryDelay().AsDuration().Minutes() <= 1)
					}
				}
			}
		}
	}
	resp, err := srv.Client().Get(srv.URL + "/healthz")
	if err != nil {
		fmt.Println(err)
		return
	}
	resp.Body.Close()
	fmt.Println("plain caller:", resp.StatusCode, "Retry-After:", resp.Header.Get("Retry-After"))
	// Output:
	// hello ada
	// resource_exhausted Retry-After: 60
	// RetryInfo within a minute: true
	// plain caller: 429 Retry-After: 60
}

// New refuses an invalid rule when the middleware is built.
func ExampleNew() {
	_, err := connectmw.New(core.NewMemory(), core.Rule{Name: "api"})
	fmt.Println(errors.Is(err, core.ErrNoLimits))
	_, err = connectmw.New(nil, core.Rule{Name: "api", Limits: []core.Limit{core.PerMinute(1)}})
	fmt.Println(errors.Is(err, core.ErrInvalidRule))
	// Output:
	// true
	// true
}
