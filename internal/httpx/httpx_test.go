package httpx_test

import (
	"fmt"
	"testing"

	"github.com/ratewindow/ratewindow/internal/httpx"
)

func TestTrimOWS(t *testing.T) {
	tests := []struct{ in, want string }{
		{"", ""},
		{"a", "a"},
		{" a", "a"},
		{"a ", "a"},
		{" \t a b \t ", "a b"},
		{"\t\t", ""},
		{"\na\n", "\na\n"}, // only spaces and tabs are OWS
		{"\u00a0a", "\u00a0a"},
	}
	for _, tt := range tests {
		if got := httpx.TrimOWS(tt.in); got != tt.want {
			t.Errorf("TrimOWS(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestStripMethod(t *testing.T) {
	tests := []struct{ in, want string }{
		{"", ""},
		{"/", "/"},
		{"/users/{id}", "/users/{id}"},
		{"GET /users/{id}", "/users/{id}"},
		{"DELETE\t/items/{id...}", "/items/{id...}"},
		{"POST  \t example.com/login", "example.com/login"},
		{"example.com/", "example.com/"},
	}
	for _, tt := range tests {
		if got := httpx.StripMethod(tt.in); got != tt.want {
			t.Errorf("StripMethod(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func ExampleStripMethod() {
	fmt.Println(httpx.StripMethod("GET /users/{id}"))
	fmt.Printf("%q\n", httpx.TrimOWS(" \tno-cache \t"))
	// Output:
	// /users/{id}
	// "no-cache"
}
