package testenv

import (
	"fmt"
	"math"

	"github.com/jazzmine/worker/wire"
)

// Comparable returns decoded event data in a form reflect.DeepEqual can compare
// across encodings: its NaNs and infinities as the encoding ct keeps them, nil in
// JSON (which writes them null) and their names in msgpack (NaN is not equal to
// itself).
func Comparable(v any, ct string) any {
	switch x := v.(type) {
	case float64:
		if math.IsNaN(x) || math.IsInf(x, 0) {
			if ct == wire.ContentTypeJSON {
				return nil
			}
			return fmt.Sprint(x)
		}
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = Comparable(e, ct)
		}
		return out
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[k] = Comparable(e, ct)
		}
		return out
	}
	return v
}
