package core

import (
	"context"
	"errors"
)

// Throttle calls fn(ctx) once one unit under every limit is free for key,
// as Wait does, and returns its result: the throttler for any function,
// such as a call to an API whose quota every replica shares. When Wait
// gives up, fn is not called and Wait's error is returned with the zero T.
// For a call that costs several units, call WaitN and then the function.
func Throttle[T any](ctx context.Context, l *Limiter, key string, limits []Limit, fn func(context.Context) (T, error)) (T, error) {
	var zero T
	switch {
	case l == nil:
		return zero, errors.New("ratewindow: Throttle: nil Limiter")
	case fn == nil:
		return zero, errors.New("ratewindow: Throttle: nil function")
	}
	if err := l.Wait(ctx, key, limits...); err != nil {
		return zero, err
	}
	return fn(ctx)
}
