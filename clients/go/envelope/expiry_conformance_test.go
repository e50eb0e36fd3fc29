package envelope_test

import (
	"encoding/hex"
	"math/big"
	"strconv"
	"testing"
	"time"

	"github.com/prism-envelope/prism/clients/go/envelope"
	"github.com/prism-envelope/prism/clients/go/internal/conformance"
)

// TestExpiryVectors runs every vector of conformance/expiry/ (README.md, kind "expiry"):
// IsExpired at now_ms must be Python's verdict and ExpiresAtMs its exact expiry. The
// subscriber drops a message by this rule, so a client that disagrees keeps what another
// drops. int64 values are decimal strings (most are beyond 2^53).
func TestExpiryVectors(t *testing.T) {
	var ran conformance.Counter
	defer ran.Check(t, "expiry")
	paths, err := conformance.FilesOfKind("expiry")
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range paths {
		var file struct {
			Vectors []struct {
				Name          string  `json:"name"`
				Layout        string  `json:"layout"`
				EnvelopeHex   string  `json:"envelope_hex"`
				PublishedAtMs string  `json:"published_at_ms"`
				TTLSeconds    *string `json:"ttl_seconds"`
				NowMs         string  `json:"now_ms"`
				ExpiresAtMs   *string `json:"expires_at_ms"`
				Expired       bool    `json:"expired"`
			} `json:"vectors"`
		}
		if err := conformance.File(path, &file); err != nil {
			t.Fatal(err)
		}
		for _, v := range file.Vectors {
			t.Run(v.Name, func(t *testing.T) {
				ran.Ran()
				data, err := hex.DecodeString(v.EnvelopeHex)
				if err != nil {
					t.Fatal(err)
				}
				if layout, err := envelope.DetectLayout(data); err != nil || layout.String() != v.Layout {
					t.Fatalf("layout %v (%v), want %s", layout, err, v.Layout)
				}
				env, err := envelope.Decode(data)
				if err != nil {
					t.Fatal(err)
				}
				md := env.Header.GetMetadata()
				if got := strconv.FormatInt(md.GetPublishedAtMs(), 10); got != v.PublishedAtMs {
					t.Errorf("published_at_ms %s, want %s", got, v.PublishedAtMs)
				}
				var ttl *string
				if md.TtlSeconds != nil {
					s := strconv.FormatInt(*md.TtlSeconds, 10)
					ttl = &s
				}
				if (ttl == nil) != (v.TTLSeconds == nil) || (ttl != nil && *ttl != *v.TTLSeconds) {
					t.Errorf("ttl_seconds %v, want %v", deref(ttl), deref(v.TTLSeconds))
				}
				exp := env.ExpiresAtMs()
				if (exp == nil) != (v.ExpiresAtMs == nil) || (exp != nil && exp.String() != *v.ExpiresAtMs) {
					t.Errorf("ExpiresAtMs %v, want %v", exp, deref(v.ExpiresAtMs))
				}
				now, err := strconv.ParseInt(v.NowMs, 10, 64)
				if err != nil {
					t.Fatal(err)
				}
				if got := env.IsExpired(time.UnixMilli(now)); got != v.Expired {
					t.Errorf("IsExpired at %d = %v, want %v", now, got, v.Expired)
				}
				// ExpiresAt: the exact expiry, clamped to the int64 milliseconds' end
				if exp != nil {
					want := exp
					if !exp.IsInt64() {
						want = big.NewInt(1<<63 - 1)
					}
					if got := env.ExpiresAt().UnixMilli(); got != want.Int64() {
						t.Errorf("ExpiresAt %d, want %s", got, want)
					}
				}
			})
		}
	}
}

func deref(s *string) string {
	if s == nil {
		return "<nil>"
	}
	return *s
}
