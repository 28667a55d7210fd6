package fence

import "errors"

// ErrStale says that a claim or a write carried a token lower than the highest its range
// has seen: the caller is not the range's primary any more (or, for a write at a point no
// claim covers, never was). Errors of this package wrap it; test with errors.Is.
var ErrStale = errors.New("stale fencing token")
