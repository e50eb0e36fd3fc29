package envelope_test

import (
	"math"
	"testing"
	"time"

	"github.com/prism-envelope/prism/clients/go/envelope"
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
