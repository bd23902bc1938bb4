package kv_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"

	"github.com/rdmakit/rdmakit/transfer"
	"github.com/rdmakit/rdmakit/transfer/kv"
)

// Prefill/decode disaggregation: a prefill node computes the KV cache of
// a request's prompt and stores it block by block under prefix-chained
// keys; a decode node (another process, usually another host) finds the
// longest cached prefix of the same prompt and reads those blocks
// one-sided into its own registered memory, then verifies them.
func Example_prefillDecode() {
	ctx := context.Background()
	secret := make([]byte, 32)
	rand.Read(secret)
	node := func(name string) transfer.Config {
		return transfer.Config{Name: name, Secret: secret, Devices: []string{"shm0"}}
	}

	// The first node runs the master and holds 64 MiB of the cache.
	prefill, err := kv.Open(ctx, kv.Config{Capacity: 64 << 20, Transfer: node("prefill")})
	if err != nil {
		panic(err)
	}
	defer prefill.Close()
	// The decode node joins it (and holds nothing itself).
	decode, err := kv.Open(ctx, kv.Config{Addr: prefill.Addr(), Transfer: node("decode")})
	if err != nil {
		panic(err)
	}
	defer decode.Close()

	// Prefill: 4 blocks of 16 tokens, each block's KV cache 256 KiB.
	const blockTokens, blockBytes = 16, 256 << 10
	prompt := make([]uint32, 4*blockTokens+5) // the last 5 tokens make no full block
	for i := range prompt {
		prompt[i] = uint32(1000 + i)
	}
	keys := kv.BlockKeys([]byte("model-7b"), prompt, blockTokens)
	blocks := make([][]byte, len(keys))
	for i := range blocks {
		blocks[i] = bytes.Repeat([]byte{byte(i + 1)}, blockBytes) // stands for the layer tensors
	}
	if err := prefill.PutBatch(ctx, keys, blocks); err != nil {
		panic(err)
	}

	// Decode: the same prompt gives the same keys; find the cached prefix
	// and read it into registered memory, no copy.
	dkeys := kv.BlockKeys([]byte("model-7b"), prompt, blockTokens)
	have, err := decode.ExistsBatch(ctx, dkeys)
	if err != nil {
		panic(err)
	}
	n := 0
	for n < len(have) && have[n] {
		n++
	}
	mem, err := decode.AllocMR(n * blockBytes)
	if err != nil {
		panic(err)
	}
	dst := make([]kv.Buf, n)
	for i := range dst {
		dst[i] = kv.Buf{MR: mem, Offset: i * blockBytes, Len: blockBytes}
	}
	if _, err := decode.GetMRBatch(ctx, dkeys[:n], dst); err != nil {
		panic(err)
	}
	ok := true
	for i := 0; i < n; i++ {
		ok = ok && bytes.Equal(mem.Bytes()[i*blockBytes:(i+1)*blockBytes], blocks[i])
	}
	fmt.Printf("decode found %d cached blocks of %d tokens, verified: %v\n", n, blockTokens, ok)
	// Output: decode found 4 cached blocks of 16 tokens, verified: true
}
