package fence

import (
	"context"
	"fmt"
	"strconv"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// EtcdValue returns the fence key's value for token: 20 decimal digits, zero-padded, so
// that etcd's byte-wise comparison of values orders tokens as numbers (2^64-1 has 20).
func EtcdValue(token uint64) string { return fmt.Sprintf("%020d", token) }

// EtcdCmp returns the comparison EtcdTxn makes, for a Txn of one's own: true when the
// fence key holds token or a lower one, false when it holds a higher one or is missing
// (etcd fails every value comparison on a missing key).
func EtcdCmp(fenceKey string, token uint64) clientv3.Cmp {
	// Compare has no "<=": a value is at most v when it sorts before v's immediate
	// successor among byte strings, v followed by a zero byte.
	return clientv3.Compare(clientv3.Value(fenceKey), "<", EtcdValue(token)+"\x00")
}

// EtcdClaim records that token now holds fenceKey, and refuses, with an error wrapping
// ErrStale, if the key holds a higher token. A new primary calls it when it takes the
// role, before it reads the state the key guards: the claim and every fenced write are
// transactions of one linearizable store, so a write of an older token either came before
// the claim (and the read sees it) or is refused. A claim with the token the key holds
// already rewrites the same value.
func EtcdClaim(ctx context.Context, kv clientv3.KV, fenceKey string, token uint64) error {
	v := EtcdValue(token)
	// One transaction, nested because an If cannot OR two comparisons: a missing key is
	// created; a present one is overwritten if its token is at most ours.
	resp, err := kv.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(fenceKey), "=", 0)).
		Then(clientv3.OpPut(fenceKey, v)).
		Else(clientv3.OpTxn(
			[]clientv3.Cmp{EtcdCmp(fenceKey, token)},
			[]clientv3.Op{clientv3.OpPut(fenceKey, v)},
			[]clientv3.Op{clientv3.OpGet(fenceKey)})).
		Commit()
	what := fmt.Sprintf("claiming %q with token %d", fenceKey, token)
	if err != nil {
		return fmt.Errorf("fence: %s: %w", what, err)
	}
	if resp.Succeeded {
		return nil
	}
	inner := resp.Responses[0].GetResponseTxn()
	if inner.Succeeded {
		return nil
	}
	return etcdStale(what, fenceKey, inner.Responses[0])
}

// EtcdTxn runs ops in one transaction if fenceKey holds token or a lower one, and refuses
// them, with an error wrapping ErrStale, if it holds a higher one or is missing (never
// claimed). Every write to the data the key guards goes through it (or through a Txn that
// makes EtcdCmp's comparison).
func EtcdTxn(ctx context.Context, kv clientv3.KV, fenceKey string, token uint64, ops ...clientv3.Op) (*clientv3.TxnResponse, error) {
	resp, err := kv.Txn(ctx).If(EtcdCmp(fenceKey, token)).Then(ops...).Else(clientv3.OpGet(fenceKey)).Commit()
	what := fmt.Sprintf("writing under %q with token %d", fenceKey, token)
	if err != nil {
		return nil, fmt.Errorf("fence: %s: %w", what, err)
	}
	if !resp.Succeeded {
		return nil, etcdStale(what, fenceKey, resp.Responses[0])
	}
	return resp, nil
}

// etcdStale describes a refusal from the fence key's value, which the Else branch read.
func etcdStale(what, fenceKey string, get *etcdserverpb.ResponseOp) error {
	kvs := get.GetResponseRange().GetKvs()
	if len(kvs) == 0 {
		return fmt.Errorf("fence: %s: %w: %q was never claimed", what, ErrStale, fenceKey)
	}
	v := string(kvs[0].Value)
	if t, err := strconv.ParseUint(v, 10, 64); err == nil && len(v) == 20 {
		return fmt.Errorf("fence: %s: %w: %q holds token %d", what, ErrStale, fenceKey, t)
	}
	return fmt.Errorf("fence: %s: %w: %q holds %q, not a token of 20 digits", what, ErrStale, fenceKey, v)
}
