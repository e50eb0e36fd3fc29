package envelope_test

import (
	"encoding/hex"
	"errors"
	"testing"

	"github.com/prism-envelope/prism/clients/go/envelope"
	"github.com/prism-envelope/prism/clients/go/prismerr"
)

// TestOddMapEntriesReadAsUpbReadsThem: an observability labels entry with a third field, and
// one whose key has another wire type, are not labels (upb, under Python, keeps them among
// the unknown fields, re-encoded); a plain entry of the same key still is. The bytes expected
// are what Python's protobuf writes for the same input (tests/clients/test_go.py compares
// many more against Python itself).
func TestOddMapEntriesReadAsUpbReadsThem(t *testing.T) {
	env, err := envelope.NewJSON("orders.created", "order-events", map[string]int{"order_id": 1}, envelope.Options{})
	if err != nil {
		t.Fatal(err)
	}
	wire, _ := envelope.Encode(env, envelope.Reviewed)
	// observability (field 3): labels {tier: silver}, then {tier, field 10 "x"}, then {key as varint 5, value "gold"}
	obs, _ := hex.DecodeString("320e0a0474696572120673696c766572" + "32090a04746965725201" + "78" + "32080805120467" + "6f6c64")
	rec := append([]byte{0x1a, byte(len(obs))}, obs...)
	got, err := envelope.Decode(append(wire, rec...))
	if err != nil {
		t.Fatal(err)
	}
	o := got.Header.GetObservability()
	if len(o.GetLabels()) != 1 || o.GetLabels()["tier"] != "silver" {
		t.Fatalf("labels %v, want only tier=silver", o.GetLabels())
	}
	unknown := hex.EncodeToString(o.ProtoReflect().GetUnknown())
	if want := "32090a0474696572520178" + "3208120467" + "6f6c640805"; unknown != want {
		t.Fatalf("unknown fields %s, want %s (the odd entries as upb re-encodes them)", unknown, want)
	}
	if r := envelope.UnknownRecords(o.ProtoReflect()); len(r) != 0 {
		t.Fatalf("UnknownRecords reports %x; Python's unknown_records reports none (field 6 is known)", r)
	}
}

// TestOddExtensionEntryRefusesConversion: an extensions entry with a third field is kept by a
// same-layout re-encoding and refused by a layout conversion (ErrAmbiguousMapEntry), as
// Python's refuse_odd_map_entries does; plain entries still convert.
func TestOddExtensionEntryRefusesConversion(t *testing.T) {
	env, err := envelope.NewJSON("orders.created", "order-events", map[string]int{"order_id": 1}, envelope.Options{})
	if err != nil {
		t.Fatal(err)
	}
	plain, _ := hex.DecodeString("0a047469657212036f6c64")   // {tier: old}
	odd, _ := hex.DecodeString("0a047469657212036f6c641801") // {tier: old, 3: 1}
	for _, c := range []struct {
		lay   envelope.Layout
		field byte // the extensions field's tag, first byte (97 and 99 take two)
	}{{envelope.Reviewed, 0x8a}, {envelope.Draft, 0x9a}} {
		wire, _ := envelope.Encode(env, c.lay)
		entry := func(e []byte) []byte { return append([]byte{c.field, 0x06, byte(len(e))}, e...) }
		ok := append(append([]byte{}, wire...), entry(plain)...)
		for _, to := range []envelope.Layout{envelope.Draft, envelope.Reviewed} {
			if _, _, err := envelope.Convert(ok, to); err != nil {
				t.Fatalf("plain entry, %v -> %v: %v", c.lay, to, err)
			}
		}
		bad := append(append([]byte{}, wire...), entry(odd)...)
		other := envelope.Draft
		if c.lay == envelope.Draft {
			other = envelope.Reviewed
		}
		if _, _, err := envelope.Convert(bad, other); !errors.Is(err, prismerr.ErrAmbiguousMapEntry) {
			t.Fatalf("odd entry, %v -> %v: %v, want ambiguous_map_entry", c.lay, other, err)
		}
		if c.lay == envelope.Reviewed {
			if _, _, err := envelope.Convert(bad, envelope.Reviewed); err != nil {
				t.Fatalf("odd entry, same layout: %v", err)
			}
		}
	}
}
