package core

import (
	"errors"
	"reflect"
	"testing"
)

// TestParseAllow reads allow.lua's reply as each path delivers it: []int64
// from a lone FCALL (fcallInts), []any from EVALSHA and from a merged
// call's share; and refuses what is not such a reply with
// ErrUnexpectedReply, leaving nothing half read.
func TestParseAllow(t *testing.T) {
	limits := []Limit{PerMinute(10), PerSecond(2)}
	want := query{allowed: true, blocked: true, at: 1700000000000000, states: []limitState{
		{remaining: 7, retry: 0, reset: 60000000},
		{remaining: 1, retry: 0, reset: 1000000},
	}}
	ints := []int64{1, 1, 1700000000000000, 7, 0, 60000000, 1, 0, 1000000}
	boxed := make([]any, len(ints))
	for i, v := range ints {
		boxed[i] = v
	}
	asStrings := append([]any{}, boxed...)
	asStrings[2] = "1700000000000000"
	tests := []struct {
		name  string
		reply any
		ok    bool
	}{
		{"lone FCALL", ints, true},
		{"EVALSHA", boxed, true},
		{"numbers as strings", asStrings, true},
		{"too short", ints[:8], false},
		{"too long, boxed", append(append([]any{}, boxed...), int64(0)), false},
		{"not a number", append(append([]any{}, boxed[:8]...), "x"), false},
		{"an error value", append(append([]any{}, boxed[:8]...), errors.New("WRONGTYPE")), false},
		{"not an array", int64(1), false},
		{"nil", nil, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			q := query{limits: limits}
			err := parseAllow(tc.reply, &q)
			if !tc.ok {
				if !errors.Is(err, ErrUnexpectedReply) {
					t.Fatalf("parseAllow = %v, want ErrUnexpectedReply", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := query{allowed: q.allowed, blocked: q.blocked, banned: q.banned, at: q.at, states: q.states}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("parsed %+v, want %+v", got, want)
			}
		})
	}
}
