module github.com/ratewindow/ratewindow/benchmarks

go 1.26.0

replace github.com/ratewindow/ratewindow => ../

require (
	github.com/go-chi/httprate v0.12.0
	github.com/go-chi/httprate-redis v0.5.4
	github.com/go-redis/redis_rate/v10 v10.0.1
	github.com/ratewindow/ratewindow v0.0.0
	github.com/redis/go-redis/v9 v9.23.0
	github.com/redis/rueidis v1.0.79
	github.com/ulule/limiter/v3 v3.11.2
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/pkg/errors v0.9.1 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
)
