package envelope_test

import (
	"bytes"
	"errors"
	"runtime"
	"testing"

	"github.com/prism-envelope/prism/clients/go/envelope"
	"github.com/prism-envelope/prism/clients/go/prismerr"
)

// allocated is the bytes f allocates.
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// TestHeaderLimitBoundsTheWalk: the header limit is applied while the top-level records are
// walked. A record is ~40 bytes of memory and its input as little as 2 or 3, so a 16 MiB
// message of tiny records (within the message limit) was walked whole - 1.2 GB allocated -
// before its header was refused; and a flood of empty payload records, which are not header,
// was never refused at all.
func TestHeaderLimitBoundsTheWalk(t *testing.T) {
	n := envelope.DefaultLimits.MaxMessageBytes / 3
	for _, c := range []struct {
		name           string
		prefix, record []byte
	}{
		{"unknown varint records", nil, []byte{0x90, 0x03, 0x00}}, // field 50 = 0
		{"empty reviewed payload records", nil, []byte{0x9a, 0x06, 0x00}},
		{"empty draft payload records", []byte{0x08, 0x01}, []byte{0x1a, 0x00}}, // envelope_version 1
	} {
		data := append(append([]byte(nil), c.prefix...), bytes.Repeat(c.record, n)...)
		var err error
		got := allocated(func() { _, err = envelope.Decode(data) })
		if !errors.Is(err, prismerr.ErrSizeLimit) {
			t.Errorf("%s: %v, want a size limit error", c.name, err)
		}
		if got > 64<<20 {
			t.Errorf("%s: decoding %d bytes allocated %d MB", c.name, len(data), got>>20)
		}
	}
}

// TestScanEnvelopeKeepsOnePayload: one payload record of any size is not header, in either
// layout, and the limit is the same as DecodeRecords' for the rest.
func TestScanEnvelopeKeepsOnePayload(t *testing.T) {
	env, err := envelope.NewBytes("t", "ns", make([]byte, 1<<20), envelope.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, lay := range []envelope.Layout{envelope.Draft, envelope.Reviewed} {
		data, err := envelope.Encode(env, lay)
		if err != nil {
			t.Fatal(err)
		}
		for _, scanAs := range []envelope.Layout{envelope.Auto, lay} {
			if _, err := envelope.ScanEnvelope(data, scanAs, 1024); err != nil {
				t.Errorf("%v scanned as %v: %v", lay, scanAs, err)
			}
		}
		if _, err := envelope.ScanEnvelope(data, lay, 8); !errors.Is(err, prismerr.ErrSizeLimit) {
			t.Errorf("%v: an 8-byte header limit: %v", lay, err)
		}
	}
}
