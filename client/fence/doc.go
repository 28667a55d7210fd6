// Package fence makes an application's own database refuse the writes of a primary that
// is not the primary any more.
//
// Sliceplane grants the primary role of a range of the hash space with a fencing token, a
// number that only grows for a given key range. A primary that pauses (a long GC, a frozen
// VM) or is cut off from the assigner may not know it has been replaced, and may still
// write. Only the store the writes go to can stop it: it remembers the highest token each
// range has seen and refuses the writes of lower ones. This package does that for
// PostgreSQL (pgx) and for etcd.
//
// # What the application does
//
//  1. When it takes the primary role of a range (Acquire or ChangeRole to the primary
//     role), it claims the range with the grant's token, PGClaim or EtcdClaim, before it
//     reads the range's state. Once the claim returns, every write of an older token has
//     either committed, and the read sees it, or will be refused; a read made before the
//     claim could miss a write of the old primary that commits in between.
//  2. It makes every change of the range's data through the fence (PGExec, PGQueryRow,
//     EtcdTxn), with the token of its grant.
//  3. It takes an error wrapping ErrStale to mean "not the primary any more": it stops
//     acting as the range's primary, drops what it holds of it, and answers the request
//     with an error (the caller retries, and reaches the new primary), never with a value
//     computed from its stale state: the write that would have made it durable was refused.
//
// A claim that ErrStale refuses means the same: a newer grant of part of the range exists.
//
// The fence refuses lower tokens only: the new primary's writes go ahead everywhere its
// token is at least the range's, so the application still writes only where it holds the
// role.
//
// # PostgreSQL
//
// PGSchema creates a table, sliceplane_fences, with one row per claimed range (its first
// and last points as bigints, PGPoint, and its token), and two PL/pgSQL functions, which
// raise SQLSTATE SPFEN for a stale token (PGClaim and PGExec turn it into ErrStale).
// Applications in other languages call them the same way.
//
// sliceplane_claim(lo, hi, token), a claim, in one transaction: takes a table lock that
// claims alone contend for, so that claims take turns and each sees every claim committed
// before it; locks every row that overlaps the range FOR UPDATE; refuses if one holds a
// higher token; shrinks each of them to its part outside the range (an update in place,
// plus an insert when a range is split in the middle; a delete when nothing is left);
// inserts the range's row with the new token.
//
// sliceplane_fence(point, token), the check before a write: reads the highest token of the
// rows covering the point FOR SHARE and raises when there is none (the range was never
// claimed) or it is above the writer's.
//
// The locks are what make the check hold until the write commits, under READ COMMITTED,
// PostgreSQL's default:
//
//   - FOR SHARE keeps the covering row locked until the writer's transaction ends. A claim
//     of the point needs the row FOR UPDATE, so it waits for the write to commit, and the
//     new primary's read, after the claim, sees it. Writers share the lock and do not wait
//     for one another.
//   - The claim updates the rows, not only locks them. A writer that comes while a claim is
//     under way waits for the row the claim holds; when the claim commits, PostgreSQL
//     re-checks the row's newest version against the writer's condition (EvalPlanQual), but
//     keeps the writer's older snapshot for everything else. Were the row only locked, the
//     writer would find it unchanged, with its own token, and write after the claim, unseen
//     by the new primary. Updated or deleted, the row no longer covers the point, and the
//     check looks again with a new snapshot, which holds the claim's rows: it refuses the
//     old primary, and lets it write where a split left it a part of its range.
//
// PGExec sends the check and the caller's statement in one pgx.Batch: one round trip once
// pgx has prepared them on the connection. Outside a transaction, pgx ends a batch with one
// Sync, and PostgreSQL runs what comes before a Sync as one implicit transaction, so the check's lock lasts until the write commits and a
// refused check aborts the write. Inside a pgx.Tx, the lock lasts until the transaction
// ends, and a refusal aborts the transaction, which the caller then rolls back. Under
// REPEATABLE READ or SERIALIZABLE, a claim that commits while a write waits makes the write
// fail with a serialization error rather than ErrStale, which is as safe.
//
// # etcd
//
// A fence key stands for the data it guards, and holds the highest token claimed for it,
// as 20 decimal digits (EtcdValue) so that etcd's byte-wise comparison of values orders
// tokens. EtcdClaim sets it in a transaction that refuses a lower token; EtcdTxn runs the
// caller's operations in a transaction whose condition is that the key holds the caller's
// token or a lower one (EtcdCmp, for a transaction of one's own). etcd applies a
// transaction's comparison and operations at one revision, linearizably, so a claim and a
// write cannot interleave and no locking is needed. The key is the application's choice:
// one per range when its ranges do not change, or one per unit of data (the keys under a
// prefix, say) that each new holder of the unit claims.
package fence
