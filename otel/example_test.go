package ratewindowotel_test

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/ratewindow/ratewindow/core"
	"github.com/ratewindow/ratewindow/otel" // package ratewindowotel
)

func Example() {
	reader := sdkmetric.NewManualReader() // in production: a periodic reader and an exporter
	rec, err := ratewindowotel.New(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
	if err != nil {
		panic(err)
	}
	// With Redis:
	//
	//	rdb := redis.NewClient(opts)
	//	redisotel.InstrumentTracing(rdb) // github.com/redis/go-redis/extra/redisotel/v9
	//	l, err := core.New(rdb, core.WithObserver(rec.Observe))
	//
	// Every call passes its ctx to go-redis, so l.Allow(r.Context(), ...)
	// puts the script's span under the request's span.
	l := core.NewMemory(core.WithObserver(rec.Observe))
	for range 3 {
		l.Allow(context.Background(), "user:42", core.PerMinute(2))
	}

	var rm metricdata.ResourceMetrics
	_ = reader.Collect(context.Background(), &rm)
	for _, m := range rm.ScopeMetrics[0].Metrics {
		if sum, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == "ratewindow.decisions" {
			for _, outcome := range []string{"allowed", "denied"} {
				for _, p := range sum.DataPoints {
					if v, _ := p.Attributes.Value(attribute.Key(ratewindowotel.AttrOutcome)); v.AsString() == outcome {
						fmt.Println(outcome, p.Value)
					}
				}
			}
		}
	}
	// Output:
	// allowed 2
	// denied 1
}
