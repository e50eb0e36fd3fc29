package signing_test

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"runtime"
	"testing"

	"github.com/prism-envelope/prism/clients/go/envelope"
	"github.com/prism-envelope/prism/clients/go/prismerr"
	"github.com/prism-envelope/prism/clients/go/signing"
	"google.golang.org/protobuf/proto"
)

func testKeys(t *testing.T) []*signing.SigningKey {
	t.Helper()
	secret := make([]byte, 32)
	seed := make([]byte, 32)
	_, _ = rand.Read(secret)
	_, _ = rand.Read(seed)
	h, err := signing.NewHMACKey("hmac-1", secret)
	if err != nil {
		t.Fatal(err)
	}
	e, err := signing.NewEd25519Key("ed-1", seed)
	if err != nil {
		t.Fatal(err)
	}
	return []*signing.SigningKey{h, e}
}

func order(t *testing.T, i int) *envelope.Envelope {
	t.Helper()
	pii := true
	env, err := envelope.NewJSON("orders.created", "order-events", map[string]int{"order_id": i}, envelope.Options{
		DataClassification: "restricted", ContainsPII: &pii, Labels: map[string]string{"tier": "gold"},
		Extensions: map[string][]byte{"x-tenant": []byte("acme")},
	})
	if err != nil {
		t.Fatal(err)
	}
	env.EnsureSecurity().AuthToken = proto.String("header.payload.sig")
	return env
}

// flip returns a copy of data with the byte at i changed.
func flip(data []byte, i int) []byte {
	out := bytes.Clone(data)
	out[i] ^= 0x01
	return out
}

func TestSignVerifyV2BothLayouts(t *testing.T) {
	for _, key := range testKeys(t) {
		keys := signing.NewKeys(key.VerificationKey())
		for _, lay := range []envelope.Layout{envelope.Draft, envelope.Reviewed} {
			data, err := signing.Sign(order(t, 1), key, lay, signing.ScopeV2)
			if err != nil {
				t.Fatal(err)
			}
			info, err := signing.Verify(data, keys, signing.VerifyOptions{})
			if err != nil || info.Scope != signing.ScopeV2 || info.KeyID != key.KeyID {
				t.Fatalf("%s/%v: %+v %v", key.Algorithm, lay, info, err)
			}
			env, _, err := signing.VerifyAndDecode(data, keys, signing.VerifyOptions{Layout: lay})
			if err != nil || env.Header.GetSecurity().GetDataClassification() != "restricted" {
				t.Fatalf("VerifyAndDecode: %v", err)
			}
			// a changed byte of the payload, the metadata or the classification breaks it
			for _, i := range []int{len(data) - 1, 10, bytes.Index(data, []byte("restricted"))} { // not the auth_token: scope v2 leaves it out
				_, err := signing.Verify(flip(data, i), keys, signing.VerifyOptions{})
				if err == nil {
					t.Errorf("%s/%v: byte %d flipped still verifies", key.Algorithm, lay, i)
				}
				var pe *prismerr.Error
				if !errors.As(err, &pe) {
					t.Errorf("untyped error %v", err)
				}
			}
		}
	}
}

func TestLegacyScopeRefusedUnlessAccepted(t *testing.T) {
	key := testKeys(t)[0]
	keys := signing.NewKeys(key.VerificationKey())
	data, err := signing.Sign(order(t, 1), key, envelope.Reviewed, signing.ScopeLegacy)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := signing.Verify(data, keys, signing.VerifyOptions{}); !errors.Is(err, prismerr.ErrLegacyScope) {
		t.Fatalf("legacy scope by default: %v", err)
	}
	if !errors.Is(prismerr.New("legacy_signature_scope", "x", ""), prismerr.ErrSignature) {
		t.Fatal("a legacy-scope error must be a signature error (errors.Is)")
	}
	yes := true
	if _, err := signing.Verify(data, keys, signing.VerifyOptions{AcceptLegacyScope: &yes}); err != nil {
		t.Fatalf("legacy accepted: %v", err)
	}
	keys.AcceptLegacyScope = true
	if _, err := signing.Verify(data, keys, signing.VerifyOptions{}); err != nil {
		t.Fatalf("legacy accepted by the key set: %v", err)
	}
}

func TestSignPairEachCopyVerifiesAlone(t *testing.T) {
	for _, key := range testKeys(t) {
		keys := signing.NewKeys(key.VerificationKey())
		draft, reviewed, err := signing.SignPair(order(t, 2), key)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range [][]byte{draft, reviewed} {
			info, err := signing.Verify(c, keys, signing.VerifyOptions{})
			if err != nil || info.Scope != signing.ScopePair {
				t.Fatalf("%s: %v", key.Algorithm, err)
			}
		}
		md, _, _ := signing.SignedMessage(draft, envelope.Auto)
		mr, _, _ := signing.SignedMessage(reviewed, envelope.Auto)
		if !bytes.Equal(md, mr) || len(md) != 94 {
			t.Fatalf("both copies must rebuild the same 94-byte statement")
		}
		if _, err := signing.Verify(flip(reviewed, len(reviewed)-1), keys, signing.VerifyOptions{}); !errors.Is(err, prismerr.ErrSignature) {
			t.Fatalf("tampered pair copy: %v", err)
		}
	}
}

func TestSignBatchEveryCopyVerifies(t *testing.T) {
	for _, key := range testKeys(t) {
		keys := signing.NewKeys(key.VerificationKey())
		for _, n := range []int{1, 2, 5, 8, 13} {
			envs := make([]*envelope.Envelope, n)
			for i := range envs {
				envs[i] = order(t, i)
			}
			out, err := signing.SignBatch(envs, key)
			if err != nil {
				t.Fatal(err)
			}
			for i, copies := range out {
				for _, c := range copies {
					signing.ClearVerificationCache()
					info, err := signing.Verify(c, keys, signing.VerifyOptions{})
					if err != nil || info.Scope != signing.ScopeBatch {
						t.Fatalf("%s n=%d i=%d: %v", key.Algorithm, n, i, err)
					}
					if _, err := signing.Verify(flip(c, len(c)-1), keys, signing.VerifyOptions{}); !errors.Is(err, prismerr.ErrSignature) {
						t.Fatalf("tampered batch copy verifies: %v", err)
					}
				}
			}
		}
	}
}

func TestRootFromPathRejectsBadTrees(t *testing.T) {
	leaf := make([]byte, 32)
	for _, c := range []struct {
		index, size uint64
		path        []byte
	}{{0, 0, nil}, {0, 65537, nil}, {3, 3, nil}, {0, 2, make([]byte, 31)}, {0, 2, nil}, {0, 1, make([]byte, 32)}} {
		if _, err := signing.RootFromPath(leaf, c.index, c.size, c.path); !errors.Is(err, prismerr.ErrSignature) {
			t.Errorf("index %d size %d path %d: %v", c.index, c.size, len(c.path), err)
		}
	}
}

func TestUnsignedAndUnknownKey(t *testing.T) {
	key := testKeys(t)[1]
	data, _ := envelope.Encode(order(t, 1), envelope.Reviewed)
	if _, err := signing.Verify(data, signing.NewKeys(key.VerificationKey()), signing.VerifyOptions{}); !errors.Is(err, prismerr.ErrSignature) {
		t.Fatalf("unsigned: %v", err)
	}
	signed, _ := signing.Sign(order(t, 1), key, envelope.Reviewed, signing.ScopeV2)
	if _, err := signing.Verify(signed, signing.NewKeys(), signing.VerifyOptions{}); !errors.Is(err, prismerr.ErrUnknownKey) {
		t.Fatalf("unknown key: %v", err)
	}
	if _, err := signing.NewHMACKey("short", make([]byte, 31)); !errors.Is(err, prismerr.ErrConfig) {
		t.Fatalf("short HMAC secret: %v", err)
	}
}

// TestVerifyAndDecodeLimitsBeforeTheWalk: the message limit is checked before the records are
// walked and the header limit while they are (envelope.ScanEnvelope): the walk came first, so
// 32 MiB of two-byte records (refused by the 16 MiB message limit) made ~11M records, over 1 GB
// allocated, before the refusal.
func TestVerifyAndDecodeLimitsBeforeTheWalk(t *testing.T) {
	keys := signing.NewKeys(testKeys(t)[0].VerificationKey())
	for _, size := range []int{32 << 20, 16<<20 - 64} {
		data := bytes.Repeat([]byte{0x90, 0x03, 0x00}, size/3)
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		_, _, err := signing.VerifyAndDecode(data, keys, signing.VerifyOptions{})
		runtime.ReadMemStats(&after)
		if !errors.Is(err, prismerr.ErrSizeLimit) {
			t.Errorf("%d bytes: %v, want a size limit error", len(data), err)
		}
		if got := after.TotalAlloc - before.TotalAlloc; got > 64<<20 {
			t.Errorf("%d bytes: allocated %d MB before refusing", len(data), got>>20)
		}
	}
}

// TestShortHMACVerificationKeyNeverVerifies: VerificationKey is a plain struct, so a keyring
// can hold an HMAC key whose secret is empty (an unset environment variable, say). Anyone can
// compute HMAC under the empty key: such a signature verified. A secret shorter than
// MinHMACKeyBytes is now a bad_keyring error, never a verdict.
func TestShortHMACVerificationKeyNeverVerifies(t *testing.T) {
	env, err := envelope.NewBytes("t", "ns", []byte("pay me"), envelope.Options{})
	if err != nil {
		t.Fatal(err)
	}
	real, err := signing.NewHMACKey("k", bytes.Repeat([]byte{7}, 32))
	if err != nil {
		t.Fatal(err)
	}
	wire, err := signing.Sign(env, real, envelope.Reviewed, signing.ScopeV2)
	if err != nil {
		t.Fatal(err)
	}
	m, _, err := signing.SignedMessage(wire, envelope.Reviewed)
	if err != nil {
		t.Fatal(err)
	}
	good := hmac.New(sha256.New, bytes.Repeat([]byte{7}, 32))
	good.Write(m)
	at := bytes.Index(wire, good.Sum(nil))
	if at < 0 {
		t.Fatal("signature not found in the wire bytes")
	}
	for _, secret := range [][]byte{nil, []byte("short")} {
		forger := hmac.New(sha256.New, secret)
		forger.Write(m)
		forged := append([]byte(nil), wire...)
		copy(forged[at:], forger.Sum(nil))
		keys := signing.NewKeys(&signing.VerificationKey{KeyID: "k", Algorithm: signing.HMACSHA256, Secret: secret})
		if info, err := signing.Verify(forged, keys, signing.VerifyOptions{}); !errors.Is(err, prismerr.ErrKeyring) {
			t.Errorf("a %d-byte secret: %+v, %v; want a bad_keyring error", len(secret), info, err)
		}
	}
}

// TestVerifyWithoutKeysIsAnError: a nil *Keys (no keyring configured) trusts nothing; it was a
// nil pointer dereference inside Verify.
func TestVerifyWithoutKeysIsAnError(t *testing.T) {
	env, err := envelope.NewBytes("t", "ns", []byte("x"), envelope.Options{})
	if err != nil {
		t.Fatal(err)
	}
	wire, err := signing.Sign(env, testKeys(t)[0], envelope.Reviewed, signing.ScopeV2)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := signing.Verify(wire, nil, signing.VerifyOptions{}); !errors.Is(err, prismerr.ErrUnknownKey) {
		t.Fatalf("Verify: %v", err)
	}
	if _, _, err := signing.VerifyAndDecode(wire, nil, signing.VerifyOptions{}); !errors.Is(err, prismerr.ErrUnknownKey) {
		t.Fatalf("VerifyAndDecode: %v", err)
	}
}
