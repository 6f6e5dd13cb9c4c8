package ratewindowprom_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratewindow/ratewindow/core"
	"github.com/ratewindow/ratewindow/nethttp"
	"github.com/ratewindow/ratewindow/prometheus" // package ratewindowprom
)

func ExampleCollector() {
	metrics := ratewindowprom.NewCollector(ratewindowprom.Opts{})
	registry := prometheus.NewRegistry()
	registry.MustRegister(metrics)

	// core.New(redisClient, ...) in production
	l := core.NewMemory(core.WithObserver(metrics.Observe))
	limit := nethttp.Limit(l, core.Rule{Name: "login", Limits: []core.Limit{core.PerMinute(2)}})
	h := limit(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	for range 3 {
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("POST", "/login", nil))
	}

	families, _ := registry.Gather()
	for _, f := range families {
		if f.GetName() != "ratewindow_decisions_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := ""
			for _, l := range m.GetLabel() {
				labels += l.GetName() + "=" + l.GetValue() + " "
			}
			fmt.Println(labels, m.GetCounter().GetValue())
		}
	}
	// Output:
	// outcome=allowed rule=login  2
	// outcome=denied rule=login  1
	// outcome=error rule=login  0
	// outcome=shed rule=login  0
}
