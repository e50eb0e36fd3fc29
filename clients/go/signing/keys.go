package signing

import (
	"crypto/ed25519"

	"github.com/prism-envelope/prism/clients/go/prismerr"
)

// Algorithms.
const (
	HMACSHA256 = "hmac-sha256"
	Ed25519    = "ed25519"
)

// MinHMACKeyBytes is the shortest HMAC secret accepted (as in Python).
const MinHMACKeyBytes = 32

// SigningKey signs envelopes: an HMAC-SHA256 secret or an Ed25519 private key.
type SigningKey struct {
	KeyID     string
	Algorithm string
	secret    []byte
	private   ed25519.PrivateKey
}

// NewHMACKey is an HMAC-SHA256 signing key; the secret must be at least 32 bytes.
func NewHMACKey(keyID string, secret []byte) (*SigningKey, error) {
	if len(secret) < MinHMACKeyBytes {
		return nil, prismerr.Newf("bad_keyring", "hmac-sha256 key %q is %d bytes; at least %d are required", keyID, len(secret), MinHMACKeyBytes).
			WithHint("generate 32 random bytes, e.g. head -c32 /dev/urandom | base64")
	}
	return &SigningKey{KeyID: keyID, Algorithm: HMACSHA256, secret: append([]byte(nil), secret...)}, nil
}

// NewEd25519Key is an Ed25519 signing key from its 32-byte seed (RFC 8032 private key).
func NewEd25519Key(keyID string, seed []byte) (*SigningKey, error) {
	if len(seed) != ed25519.SeedSize {
		return nil, prismerr.Newf("bad_keyring", "ed25519 key %q: the seed is %d bytes, not %d", keyID, len(seed), ed25519.SeedSize)
	}
	return &SigningKey{KeyID: keyID, Algorithm: Ed25519, private: ed25519.NewKeyFromSeed(seed)}, nil
}

// VerificationKey returns the key that verifies this key's signatures.
func (k *SigningKey) VerificationKey() *VerificationKey {
	if k.Algorithm == HMACSHA256 {
		return &VerificationKey{KeyID: k.KeyID, Algorithm: HMACSHA256, Secret: k.secret}
	}
	return &VerificationKey{KeyID: k.KeyID, Algorithm: Ed25519, PublicKey: k.private.Public().(ed25519.PublicKey)}
}

func (k *SigningKey) sign(m []byte) []byte {
	if k.Algorithm == HMACSHA256 {
		return mac(k.secret, m)
	}
	return ed25519.Sign(k.private, m)
}

// VerificationKey verifies signatures: an HMAC secret or an Ed25519 public key.
type VerificationKey struct {
	KeyID     string
	Algorithm string
	Secret    []byte
	PublicKey ed25519.PublicKey
}

// NewEd25519VerificationKey is a verify-only Ed25519 key (32-byte public key).
func NewEd25519VerificationKey(keyID string, public []byte) (*VerificationKey, error) {
	if len(public) != ed25519.PublicKeySize {
		return nil, prismerr.Newf("bad_keyring", "ed25519 key %q: the public key is %d bytes, not %d", keyID, len(public), ed25519.PublicKeySize)
	}
	return &VerificationKey{KeyID: keyID, Algorithm: Ed25519, PublicKey: append(ed25519.PublicKey(nil), public...)}, nil
}

// Keys are the keys a verifier trusts, by key id. AcceptLegacyScope is off by default: a
// legacy-scope signature leaves publisher, classification, PII flag and encryption metadata
// unprotected (docs/signing.md, "The downgrade risk"). Turn it on only while old producers
// migrate.
type Keys struct {
	byID              map[string]*VerificationKey
	AcceptLegacyScope bool
}

// NewKeys builds a key set from verification keys.
func NewKeys(keys ...*VerificationKey) *Keys {
	k := &Keys{byID: map[string]*VerificationKey{}}
	for _, key := range keys {
		k.Add(key)
	}
	return k
}

// Add trusts one more key (replacing one of the same id).
func (k *Keys) Add(key *VerificationKey) {
	if k.byID == nil {
		k.byID = map[string]*VerificationKey{}
	}
	k.byID[key.KeyID] = key
}

func (k *Keys) candidates(keyID, alg string) ([]*VerificationKey, error) {
	if keyID != "" {
		key, ok := k.byID[keyID]
		if !ok {
			return nil, prismerr.New("unknown_key", "signature key "+quote(keyID)+" is not in the verifier's keyring",
				"add the producer's verification key to the namespace keyring").At("security.signature_key_id")
		}
		if key.Algorithm != alg {
			return nil, prismerr.New("bad_signature", "key "+quote(keyID)+" is a "+key.Algorithm+" key but the envelope says "+alg, "").
				At("security.signature_algorithm")
		}
		return []*VerificationKey{key}, nil
	}
	var found []*VerificationKey
	for _, key := range k.byID {
		if key.Algorithm == alg {
			found = append(found, key)
		}
	}
	if len(found) == 0 {
		return nil, prismerr.New("unknown_key", "no "+alg+" key configured and the envelope names none", "").At("security.signature_key_id")
	}
	return found, nil
}

// All returns the trusted keys.
func (k *Keys) All() []*VerificationKey {
	out := make([]*VerificationKey, 0, len(k.byID))
	for _, key := range k.byID {
		out = append(out, key)
	}
	return out
}
