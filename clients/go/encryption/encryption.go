// Package encryption encrypts and decrypts envelope payloads with the patterns the Prism
// worker and the Python SDK produce and accept (docs/encryption.md): AES-256-GCM or
// ChaCha20-Poly1305 with a shared key, RSA-OAEP (direct or wrapped), ML-KEM-768/1024
// (crypto/mlkem) and the X25519 + ML-KEM-1024 hybrid. Only payload.value is encrypted;
// the AAD binds the ciphertext to the envelope's message id, namespace, topic, algorithm
// and key id.
//
// Every failure is a *prismerr.Error: ErrDecryption for anything cryptographic (one opaque
// message, no oracle on which step failed), ErrAlgorithm for refused algorithms,
// ErrUnknownKey for unknown key ids, ErrEncryption for an already-encrypted payload.
package encryption

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/ecdh"
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/mlkem"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"

	"github.com/prism-envelope/prism/clients/go/envelope"
	"github.com/prism-envelope/prism/clients/go/gen/reviewedpb"
	"github.com/prism-envelope/prism/clients/go/prismerr"
	"golang.org/x/crypto/chacha20poly1305"
	"google.golang.org/protobuf/proto"
)

// Constants of the byte construction (docs/encryption.md).
const (
	NonceBytes = 12
	KeyBytes   = 32
)

var (
	// AADPrefix starts every Prism AAD.
	AADPrefix      = []byte("prism-envelope-aad/v1\x00")
	hybridKDFSalt  = []byte("prism-envelope/x25519-ml-kem-1024/v1")
	hybridKDFInfo  = []byte("prism-envelope payload key")
	errOpaqueWhat  = "payload does not decrypt: tampered ciphertext, iv, tag or encapsulated key, or the wrong key"
	decryptionHint = "the payload or its encryption metadata was altered, the key differs from the producer's, or the envelope was re-labelled"
)

func quote(s string) string { b, _ := json.Marshal(s); return string(b) }

func fail(what, path string) error {
	if path == "" {
		path = "security.encryption"
	}
	return prismerr.New("decryption_failed", what, decryptionHint).At(path)
}

// BuildAAD is the AAD Prism authenticates: the prefix, then message_id, namespace, topic,
// algorithm and key_id, each as a 4-byte big-endian length and its UTF-8 bytes.
func BuildAAD(messageID, namespace, topic, algorithm, keyID string) []byte {
	out := append([]byte(nil), AADPrefix...)
	for _, v := range []string{messageID, namespace, topic, algorithm, keyID} {
		out = binary.BigEndian.AppendUint32(out, uint32(len(v)))
		out = append(out, v...)
	}
	return out
}

func envelopeAAD(env *envelope.Envelope, algorithm, keyID string) []byte {
	md := env.Header.GetMetadata()
	return BuildAAD(md.GetMessageId(), md.GetNamespace(), md.GetTopic(), algorithm, keyID)
}

// HybridPrivateKey is an x25519-ml-kem-1024 recipient key.
type HybridPrivateKey struct {
	X25519 *ecdh.PrivateKey
	MLKEM  *mlkem.DecapsulationKey1024
}

// HybridPublicKey is the public half of a HybridPrivateKey.
type HybridPublicKey struct {
	X25519 *ecdh.PublicKey
	MLKEM  *mlkem.EncapsulationKey1024
}

// Keyring holds key material by key id, for decrypting (and, through its public halves,
// encrypting). Envelopes carry only key ids.
type Keyring struct {
	Symmetric map[string][]byte // 32-byte keys (aes-256-gcm, chacha20-poly1305)
	RSA       map[string]*rsa.PrivateKey
	MLKEM768  map[string]*mlkem.DecapsulationKey768
	MLKEM1024 map[string]*mlkem.DecapsulationKey1024
	Hybrid    map[string]*HybridPrivateKey
	// DataKeys unwrap the data keys of the key_wrap pattern (kms.go), by WrapName.
	DataKeys map[string]DataKeyProvider
}

// NewKeyring returns an empty keyring.
func NewKeyring() *Keyring {
	return &Keyring{Symmetric: map[string][]byte{}, RSA: map[string]*rsa.PrivateKey{}, MLKEM768: map[string]*mlkem.DecapsulationKey768{},
		MLKEM1024: map[string]*mlkem.DecapsulationKey1024{}, Hybrid: map[string]*HybridPrivateKey{}, DataKeys: map[string]DataKeyProvider{}}
}

func unknownKey(kid string) error {
	return prismerr.New("unknown_key", "encryption key "+quote(kid)+" is not in the keyring",
		"add the key to the consumer's keyring").At("security.encryption.key_id")
}

func wrongType(kid, alg string) error {
	return prismerr.New("key_not_usable", "key "+quote(kid)+" is not a key for "+alg,
		"the key id in the envelope names a key of another type in this keyring").At("security.encryption.key_id")
}

func aead(alg string, key []byte) (cipher.AEAD, error) {
	if len(key) != KeyBytes {
		return nil, prismerr.Newf("key_not_usable", "%s needs a %d-byte key, got %d bytes", alg, KeyBytes, len(key)).At("security.encryption.key_id")
	}
	if alg == ChaCha20Poly1305 {
		return chacha20poly1305.New(key)
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}

func hybridKey(xss, mss, ephPub, recipientPub []byte) ([]byte, error) {
	info := append(append(append([]byte(nil), hybridKDFInfo...), ephPub...), recipientPub...)
	return hkdf.Key(sha256.New, append(append([]byte(nil), xss...), mss...), hybridKDFSalt, string(info), KeyBytes)
}

func legacyHybridKey(xss, mss []byte) []byte {
	m := hmac.New(sha256.New, make([]byte, 32))
	m.Write(xss)
	m.Write(mss)
	return m.Sum(nil)
}

// ------------------------------------------------------------------ encrypt

// Options tune encryption. Policy is checked as on the Python side.
type Options struct {
	Policy Policy
}

func begin(env *envelope.Envelope, algorithm string, opts Options) (spec, []byte, error) {
	if env.IsEncrypted() {
		return spec{}, nil, prismerr.New("encryption_failed", "payload is already encrypted", "decrypt it first, or send it as it is").At("security.encryption")
	}
	s, err := opts.Policy.check(algorithm, false)
	if err != nil {
		return spec{}, nil, err
	}
	v, err := env.Payload.Value()
	if err != nil {
		return spec{}, nil, err
	}
	return s, v, nil
}

func finish(env *envelope.Envelope, meta *reviewedpb.EncryptionMetadata, ciphertext []byte) {
	tu, _ := env.Payload.TypeURL()
	env.EnsureSecurity().Encryption = meta
	env.Payload = envelope.NewPayload(tu, ciphertext)
}

func sealGCM(key, iv, plaintext, aad []byte) []byte {
	c, _ := aead(AES256GCM, key)
	return c.Seal(nil, iv, plaintext, aad)
}

func nonce() []byte {
	iv := make([]byte, NonceBytes)
	_, _ = rand.Read(iv)
	return iv
}

// EncryptSymmetric encrypts the payload with a 32-byte shared key (aes-256-gcm or
// chacha20-poly1305) named keyID.
func EncryptSymmetric(env *envelope.Envelope, algorithm, keyID string, key []byte, opts Options) error {
	s, plaintext, err := begin(env, algorithm, opts)
	if err != nil {
		return err
	}
	if s.pattern != symmetric {
		return algErr(algorithm+" is not a shared-key algorithm", "use EncryptMLKEM or EncryptHybrid")
	}
	c, err := aead(s.name, key)
	if err != nil {
		return err
	}
	meta := &reviewedpb.EncryptionMetadata{KeyId: keyID, Algorithm: s.name, EncryptionType: s.encryptionType(), Iv: nonce()}
	meta.Aad = envelopeAAD(env, meta.Algorithm, keyID)
	finish(env, meta, c.Seal(nil, meta.Iv, plaintext, meta.Aad))
	return nil
}

// EncryptMLKEM1024 encrypts the payload for an ML-KEM-1024 recipient key.
func EncryptMLKEM1024(env *envelope.Envelope, keyID string, pub *mlkem.EncapsulationKey1024, opts Options) error {
	_, plaintext, err := begin(env, MLKEM1024, opts)
	if err != nil {
		return err
	}
	ss, ct := pub.Encapsulate()
	return encryptKEM(env, MLKEM1024, keyID, ss, ct, plaintext)
}

// EncryptMLKEM768 encrypts the payload for an ML-KEM-768 recipient key.
func EncryptMLKEM768(env *envelope.Envelope, keyID string, pub *mlkem.EncapsulationKey768, opts Options) error {
	_, plaintext, err := begin(env, MLKEM768, opts)
	if err != nil {
		return err
	}
	ss, ct := pub.Encapsulate()
	return encryptKEM(env, MLKEM768, keyID, ss, ct, plaintext)
}

func encryptKEM(env *envelope.Envelope, alg, keyID string, ss, ct, plaintext []byte) error {
	params, _ := json.Marshal(map[string]string{"kem": alg, "dem": AES256GCM, "kdf": "none"})
	meta := &reviewedpb.EncryptionMetadata{KeyId: keyID, PublicKeyId: proto.String(keyID), Algorithm: alg,
		EncryptionType: reviewedpb.EncryptionType_ENCRYPTION_TYPE_POST_QUANTUM, EncapsulatedKey: ct,
		AlgorithmParams: proto.String(string(params)), Iv: nonce()}
	meta.Aad = envelopeAAD(env, alg, keyID)
	finish(env, meta, sealGCM(ss, meta.Iv, plaintext, meta.Aad))
	return nil
}

// EncryptHybrid encrypts the payload for an x25519-ml-kem-1024 recipient (docs/encryption.md,
// "Hybrid"): an ephemeral X25519 exchange plus an ML-KEM-1024 encapsulation, HKDF-SHA256.
func EncryptHybrid(env *envelope.Envelope, keyID string, pub *HybridPublicKey, opts Options) error {
	s, plaintext, err := begin(env, X25519MLKEM1024, opts)
	if err != nil {
		return err
	}
	eph, err := ecdh.X25519().GenerateKey(rand.Reader)
	if err != nil {
		return prismerr.New("encryption_failed", "cannot generate an ephemeral X25519 key: "+err.Error(), "")
	}
	xss, err := eph.ECDH(pub.X25519)
	if err != nil {
		return prismerr.New("encryption_failed", "X25519 exchange failed: "+err.Error(), "check the recipient's public key")
	}
	mss, ct := pub.MLKEM.Encapsulate()
	ephPub := eph.PublicKey().Bytes()
	key, err := hybridKey(xss, mss, ephPub, pub.X25519.Bytes())
	if err != nil {
		return prismerr.New("encryption_failed", "key derivation failed: "+err.Error(), "")
	}
	b64 := base64.StdEncoding.EncodeToString
	params, _ := json.Marshal(map[string]string{"x25519_ephemeral_public": b64(ephPub), "kdf": "hkdf-sha256",
		"kdf_salt": b64(hybridKDFSalt), "kdf_info_prefix": b64(hybridKDFInfo), "dem": AES256GCM})
	meta := &reviewedpb.EncryptionMetadata{KeyId: keyID, PublicKeyId: proto.String(keyID), Algorithm: s.name,
		EncryptionType: s.encryptionType(), EncapsulatedKey: ct, AlgorithmParams: proto.String(string(params)), Iv: nonce()}
	meta.Aad = envelopeAAD(env, meta.Algorithm, keyID)
	finish(env, meta, sealGCM(key, meta.Iv, plaintext, meta.Aad))
	return nil
}

// EncryptRSA encrypts the payload for an RSA-OAEP-3072/4096 recipient: directly when it
// fits (k/8 - 66 bytes), otherwise wrapped (a fresh AES-256-GCM key under RSA-OAEP).
func EncryptRSA(env *envelope.Envelope, keyID string, pub *rsa.PublicKey, opts Options) error {
	if pub == nil {
		return prismerr.New("key_not_usable", "no RSA public key given", "")
	}
	alg := RSAOAEP4096
	if pub.N.BitLen() == 3072 {
		alg = RSAOAEP3072
	} else if pub.N.BitLen() != 4096 {
		return prismerr.Newf("key_not_usable", "RSA key %q has %d bits; use 3072 or 4096", keyID, pub.N.BitLen())
	}
	_, plaintext, err := begin(env, alg, opts)
	if err != nil {
		return err
	}
	meta := &reviewedpb.EncryptionMetadata{KeyId: keyID, PublicKeyId: proto.String(keyID), Algorithm: alg,
		EncryptionType: reviewedpb.EncryptionType_ENCRYPTION_TYPE_ASYMMETRIC}
	meta.Aad = envelopeAAD(env, alg, keyID)
	var ct []byte
	if len(plaintext) <= pub.Size()-66 {
		ct, err = rsa.EncryptOAEP(sha256.New(), rand.Reader, pub, plaintext, meta.Aad)
		meta.AlgorithmParams = proto.String(`{"mode":"direct","oaep":"sha-256","oaep_label":"aad"}`)
	} else {
		cek := make([]byte, KeyBytes)
		_, _ = rand.Read(cek)
		meta.EncapsulatedKey, err = rsa.EncryptOAEP(sha256.New(), rand.Reader, pub, cek, meta.Aad)
		meta.Iv = nonce()
		ct = sealGCM(cek, meta.Iv, plaintext, meta.Aad)
		meta.AlgorithmParams = proto.String(`{"mode":"wrapped","oaep":"sha-256","oaep_label":"aad","dem":"aes-256-gcm"}`)
	}
	if err != nil {
		return prismerr.New("encryption_failed", "RSA-OAEP failed: "+err.Error(), "")
	}
	finish(env, meta, ct)
	return nil
}

// ------------------------------------------------------------------ decrypt

// DecryptOptions tune decryption. RequireAAD defaults to true (nil): envelopes whose AAD
// does not bind them to their metadata are refused. false also reads RFC-031-style
// producers that set no AAD or their own (a stored AAD in Prism's format must still match).
type DecryptOptions struct {
	Policy     Policy
	RequireAAD *bool
	// Context bounds the key service's call when the data key is wrapped (key_wrap); nil
	// means context.Background().
	Context context.Context
}

// Decrypt returns the payload as it was before encryption (still compressed when
// content_encoding says so). The envelope is not modified.
func Decrypt(env *envelope.Envelope, keys *Keyring, opts DecryptOptions) ([]byte, error) {
	if keys == nil { // no keyring: no key (unknown_key), never a nil dereference
		keys = NewKeyring()
	}
	meta := env.Header.GetSecurity().GetEncryption()
	if meta == nil {
		return nil, prismerr.New("decryption_failed", "envelope is not encrypted (no security.encryption)", "read it with Envelope.PayloadBytes").At("security.encryption")
	}
	s, err := opts.Policy.check(meta.Algorithm, true)
	if err != nil {
		return nil, err
	}
	if meta.EncryptionType != reviewedpb.EncryptionType_ENCRYPTION_TYPE_UNSPECIFIED && meta.EncryptionType != s.encryptionType() {
		return nil, fail("encryption_type "+meta.EncryptionType.String()+" does not match algorithm "+quote(meta.Algorithm), "security.encryption.encryption_type")
	}
	kid := meta.KeyId
	if kid == "" {
		return nil, fail("key_id is empty: the consumer cannot know which key decrypts", "security.encryption.key_id")
	}
	require := opts.RequireAAD == nil || *opts.RequireAAD
	expected := envelopeAAD(env, meta.Algorithm, kid)
	aad := expected
	if subtle.ConstantTimeCompare(meta.Aad, expected) != 1 {
		if require || len(meta.Aad) >= len(AADPrefix) && string(meta.Aad[:len(AADPrefix)]) == string(AADPrefix) {
			return nil, fail("aad does not match this envelope's message id, namespace, topic, algorithm or key id (the ciphertext was moved to another envelope or its metadata changed)", "security.encryption.aad")
		}
		aad = meta.Aad
	}
	params := map[string]any{}
	if p := meta.GetAlgorithmParams(); p != "" {
		var raw any
		if json.Unmarshal([]byte(p), &raw) != nil {
			return nil, fail("algorithm_params is not valid JSON", "security.encryption.algorithm_params")
		}
		obj, ok := raw.(map[string]any)
		if !ok {
			return nil, fail("algorithm_params must be a JSON object", "security.encryption.algorithm_params")
		}
		params = obj
	}
	ciphertext, err := env.Payload.Value()
	if err != nil {
		return nil, err
	}
	iv := func() ([]byte, error) {
		if len(meta.Iv) != NonceBytes {
			return nil, fail("iv is "+itoa(len(meta.Iv))+" bytes; a 96-bit nonce is required", "security.encryption.iv")
		}
		return meta.Iv, nil
	}
	open := func(key, nonce []byte) ([]byte, error) {
		c, err := aead(s.name, key)
		if s.pattern != symmetric {
			c, err = aead(AES256GCM, key)
		}
		if err != nil {
			return nil, fail(errOpaqueWhat, "")
		}
		out, err := c.Open(nil, nonce, ciphertext, aad)
		if err != nil {
			return nil, fail(errOpaqueWhat, "")
		}
		return out, nil
	}
	switch s.pattern {
	case symmetric:
		var key []byte
		if w := params["key_wrap"]; truthy(w) { // as Python's `if params.get("key_wrap")`
			name, _ := w.(string)
			p := keys.DataKeys[name]
			if name == "" || p == nil {
				return nil, prismerr.New("key_not_usable", "the data key is wrapped by "+quote(fmt.Sprint(w))+"; this keyring cannot unwrap it",
					"add the key service's DataKeyProvider to Keyring.DataKeys").At("security.encryption.algorithm_params")
			}
			if len(meta.EncapsulatedKey) == 0 {
				return nil, fail("encapsulated_key (the wrapped data key) is missing", "security.encryption.encapsulated_key")
			}
			ctx := opts.Context
			if ctx == nil {
				ctx = context.Background()
			}
			k, err := p.DecryptDataKey(ctx, kid, meta.EncapsulatedKey, KMSContext(env))
			if err != nil {
				return nil, providerErr(err, "unwrap")
			}
			key = k
		} else {
			k, ok := keys.Symmetric[kid]
			if !ok {
				return nil, unknownKey(kid)
			}
			key = k
		}
		n, err := iv()
		if err != nil {
			return nil, err
		}
		return open(key, n)
	case asymmetric:
		priv, ok := keys.RSA[kid]
		if !ok {
			return nil, unknownKey(kid)
		}
		if priv.N.BitLen() != s.rsaBits {
			return nil, wrongType(kid, s.name)
		}
		mode, _ := params["mode"].(string)
		if mode == "" {
			mode = "direct"
		}
		if o, ok := params["oaep"]; ok && o != "sha-256" {
			return nil, fail("unsupported OAEP hash", "security.encryption.algorithm_params")
		}
		if mode == "direct" {
			out, err := rsa.DecryptOAEP(sha256.New(), nil, priv, ciphertext, aad)
			if err != nil {
				return nil, fail(errOpaqueWhat, "")
			}
			return out, nil
		}
		if dem, ok := params["dem"]; mode != "wrapped" || ok && dem != AES256GCM {
			return nil, fail("unsupported RSA mode "+quote(mode), "security.encryption.algorithm_params")
		}
		n, err := iv()
		if err != nil {
			return nil, err
		}
		cek, err := rsa.DecryptOAEP(sha256.New(), nil, priv, meta.EncapsulatedKey, aad)
		if err != nil {
			return nil, fail(errOpaqueWhat, "")
		}
		return open(cek, n)
	case postQuantum:
		var ss []byte
		if s.kemBits == 768 {
			priv, ok := keys.MLKEM768[kid]
			if !ok {
				return nil, unknownOrWrong(keys, kid, s.name)
			}
			ss, err = priv.Decapsulate(meta.EncapsulatedKey)
		} else {
			priv, ok := keys.MLKEM1024[kid]
			if !ok {
				return nil, unknownOrWrong(keys, kid, s.name)
			}
			ss, err = priv.Decapsulate(meta.EncapsulatedKey)
		}
		n, ierr := iv()
		if ierr != nil {
			return nil, ierr
		}
		if err != nil {
			return nil, fail(errOpaqueWhat, "")
		}
		observe("ml_kem_shared_secret", ss)
		observe("aead_key", ss)
		return open(ss, n)
	}
	// hybrid
	priv, ok := keys.Hybrid[kid]
	if !ok {
		return nil, unknownOrWrong(keys, kid, s.name)
	}
	if kdf, ok := params["kdf"]; s.legacyOf == "" && ok && kdf != "hkdf-sha256" {
		return nil, fail("unsupported KDF", "security.encryption.algorithm_params")
	}
	b64, _ := params["x25519_ephemeral_public"].(string)
	ephPub, err := base64.StdEncoding.Strict().DecodeString(b64)
	if err != nil || b64 == "" {
		return nil, fail("algorithm_params.x25519_ephemeral_public is missing or not base64", "security.encryption.algorithm_params")
	}
	if len(ephPub) != 32 {
		return nil, fail("algorithm_params.x25519_ephemeral_public is "+itoa(len(ephPub))+" bytes, expected 32", "security.encryption.algorithm_params")
	}
	n, err := iv()
	if err != nil {
		return nil, err
	}
	eph, err := ecdh.X25519().NewPublicKey(ephPub)
	if err != nil {
		return nil, fail(errOpaqueWhat, "")
	}
	xss, err := priv.X25519.ECDH(eph)
	if err != nil {
		return nil, fail(errOpaqueWhat, "")
	}
	mss, err := priv.MLKEM.Decapsulate(meta.EncapsulatedKey)
	if err != nil {
		return nil, fail(errOpaqueWhat, "")
	}
	var key []byte
	if s.legacyOf != "" {
		key = legacyHybridKey(xss, mss)
	} else if key, err = hybridKey(xss, mss, ephPub, priv.X25519.PublicKey().Bytes()); err != nil {
		return nil, fail(errOpaqueWhat, "")
	}
	observe("x25519_shared_secret", xss)
	observe("ml_kem_shared_secret", mss)
	observe("aead_key", key)
	return open(key, n)
}

func unknownOrWrong(keys *Keyring, kid, alg string) error {
	if _, ok := keys.Symmetric[kid]; ok {
		return wrongType(kid, alg)
	}
	if _, ok := keys.MLKEM1024[kid]; ok {
		return wrongType(kid, alg)
	}
	if _, ok := keys.MLKEM768[kid]; ok {
		return wrongType(kid, alg)
	}
	if _, ok := keys.Hybrid[kid]; ok {
		return wrongType(kid, alg)
	}
	return unknownKey(kid)
}

// DecryptToEnvelope returns a copy of env with the plaintext payload and no
// security.encryption. The signature is removed too: it covered the ciphertext.
func DecryptToEnvelope(env *envelope.Envelope, keys *Keyring, opts DecryptOptions) (*envelope.Envelope, error) {
	plaintext, err := Decrypt(env, keys, opts)
	if err != nil {
		return nil, err
	}
	out := env.Clone()
	sec := out.Header.Security
	sec.Encryption, sec.Signature, sec.SignatureAlgorithm, sec.SignatureKeyId, sec.SignatureScope = nil, nil, nil, nil, nil
	sec.SiblingDigest, sec.TreeIndex, sec.TreeSize, sec.TreePath = nil, nil, nil, nil
	tu, _ := env.Payload.TypeURL()
	out.Payload = envelope.NewPayload(tu, plaintext)
	return out, nil
}

// observe lets this package's tests see the intermediate values of a decryption (the
// conformance vectors give them); a no-op otherwise.
var observe = func(name string, value []byte) {}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }
