package kv

// Prefix-chained token block keys. No goroutines.

import (
	"crypto/sha256"
	"encoding/binary"
)

// BlockKeys returns one key per full block of blockTokens tokens, chained
// by prefix as serving engines key their prefix caches: key_i =
// SHA-256(key_{i-1} | tokens of block i, little-endian uint32s), key_{-1} =
// parent (nil for a sequence's first block; pass a previous key to extend
// a sequence, or a model/tenant salt). Two sequences share key_i exactly
// when they share their first (i+1)×blockTokens tokens (and parent). A
// trailing partial block gets no key. The keys are 32 bytes.
func BlockKeys(parent []byte, tokens []uint32, blockTokens int) [][]byte {
	if blockTokens <= 0 {
		return nil
	}
	n := len(tokens) / blockTokens
	keys := make([][]byte, 0, n)
	prev := parent
	buf := make([]byte, 4*blockTokens)
	for i := 0; i < n; i++ {
		h := sha256.New()
		h.Write(prev)
		for j, t := range tokens[i*blockTokens : (i+1)*blockTokens] {
			binary.LittleEndian.PutUint32(buf[4*j:], t)
		}
		h.Write(buf)
		prev = h.Sum(nil)
		keys = append(keys, prev)
	}
	return keys
}
