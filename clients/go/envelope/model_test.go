package envelope_test

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/prism-envelope/prism/clients/go/envelope"
	"github.com/prism-envelope/prism/clients/go/prismerr"
)

// TestIsExpiredDoesNotWrap: expiry is published_at_ms + ttl_seconds*1000 computed exactly, as
// Python computes it. In int64 arithmetic a TTL of math.MaxInt64 (accepted by the builders and
// by Python's options, a "never expires") wrapped around to a time in the past, and the
// subscriber acknowledged and dropped the message as expired.
func TestIsExpiredDoesNotWrap(t *testing.T) {
	now := time.UnixMilli(1_764_560_000_000)
	for _, c := range []struct {
		pub, ttl int64
		expired  bool
	}{
		{now.UnixMilli(), math.MaxInt64, false},
		{now.UnixMilli(), 9_300_000_000_000_000, false}, // ttl*1000 overflows int64
		{math.MaxInt64, 1, false},                       // published_at_ms + 1000 overflows
		{math.MinInt64, math.MaxInt64/1000 + 1, true},   // exact: 192 ms after the epoch
		{now.UnixMilli() - 1000, 1, true},               // exactly at the expiry
		{now.UnixMilli() - 999, 1, false},
		{now.UnixMilli() - 10_000_000, 0, false}, // no TTL
	} {
		ttl := c.ttl
		env, err := envelope.NewBytes("t", "ns", []byte("x"), envelope.Options{TTLSeconds: &ttl})
		if err != nil {
			t.Fatal(err)
		}
		env.Header.Metadata.PublishedAtMs = c.pub
		if got := env.IsExpired(now); got != c.expired {
			t.Errorf("published_at_ms=%d ttl_seconds=%d: IsExpired=%v, want %v (ExpiresAt %v)", c.pub, c.ttl, got, c.expired, env.ExpiresAt())
		}
		if exp := env.ExpiresAt(); !c.expired && c.ttl > 0 && !exp.After(now) {
			t.Errorf("published_at_ms=%d ttl_seconds=%d: ExpiresAt %v is not after now", c.pub, c.ttl, exp)
		}
	}
}

// TestPayloadJSONIsBounded: PayloadJSON applies the checks of Python's and Rust's
// payload_json (app/untrusted_json.py): encoding/json alone read invalid UTF-8 as U+FFFD - a
// value where they refuse the payload - and nested 10,000 levels deep where they stop at 64.
func TestPayloadJSONIsBounded(t *testing.T) {
	for _, c := range []struct {
		name    string
		payload []byte
		ok      bool
	}{
		{"plain", []byte(`{"a":[1,{"b":"c"}]}`), true},
		{"64 levels", []byte(strings.Repeat("[", 64) + strings.Repeat("]", 64)), true},
		{"brackets in strings", []byte(`["` + strings.Repeat("[", 100) + `"]`), true},
		{"invalid UTF-8 in a string", []byte("{\"a\":\"\xff\"}"), false},
		{"65 levels", []byte(strings.Repeat("[", 65) + strings.Repeat("]", 65)), false},
	} {
		env, err := envelope.NewBytes("t", "ns", c.payload, envelope.Options{ContentType: "application/json"})
		if err != nil {
			t.Fatal(err)
		}
		var v any
		err = env.PayloadJSON(&v)
		if c.ok && err != nil || !c.ok && !errors.Is(err, prismerr.ErrPayload) {
			t.Errorf("%s: %v (value %v)", c.name, err, v)
		}
	}
}
