package wire

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// The msgpack library encodes and decodes jobs and events by their struct
// tags. This file holds what it cannot do: check a message as a whole before
// it is decoded, so that a hostile one cannot make the library allocate the
// lengths it announces or recurse without bound, and so that a value of the
// wrong type gets an error naming its field, where the library would convert
// it silently (a float into an integer field) or name only a Go type.

// maxDepth bounds the nesting of arrays and maps in a message, in both
// encodings: the same limit as encoding/json.
const maxDepth = 10000

// encodeMsgpack encodes v with sorted map keys and compact integers.
func encodeMsgpack(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := msgpack.GetEncoder()
	defer msgpack.PutEncoder(enc)
	enc.Reset(&buf)
	enc.SetSortMapKeys(true)
	enc.UseCompactInts(true)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// decodeMsgpack checks b with scan against k, the kind of the struct ptr
// points to, and decodes it into that struct.
func decodeMsgpack(b []byte, k kind, ptr any) error {
	if err := scan(b, k); err != nil {
		return err
	}
	dec := msgpack.GetDecoder()
	defer msgpack.PutDecoder(dec)
	dec.Reset(bytes.NewReader(b))
	dec.UseLooseInterfaceDecoding(true) // int64, uint64, float64 and string in Event.Data
	return dec.Decode(ptr)
}

// A kind is what a field of a message may hold, for the checks of scan.
type kind uint8

const (
	anyKind       kind = iota // an unknown field or its contents: not checked
	keyKind                   // a map key: a string
	stringKind                // string
	boolKind                  // bool
	numberKind                // float64
	intKind                   // int, int64
	uintKind                  // uint64
	stringsKind               // []string
	stringMapKind             // map[string]string
	valueKind                 // Event.Data: JSON-like values
	bytesKind                 // []byte: binary or a string, any bytes
	filesKind                 // []File: an array of maps
	fileKind                  // File: a map of fileFields
	jobKind                   // Job: a map of jobFields
	eventKind                 // eventWire: a map of eventFields
)

// kinds says of each kind what it wants, in the errors of both encodings;
// the formats it takes, a bit each (nil is taken but in a map key); the kind
// of its elements or its map values; and a struct's kinds of fields.
var kinds = [...]struct {
	want    string
	formats uint16
	elem    kind
	fields  map[string]kind
}{
	keyKind:       {want: "a string", formats: 1<<fStr | 1<<fBin},
	stringKind:    {want: "a string", formats: 1<<fStr | 1<<fBin},
	boolKind:      {want: "a boolean", formats: 1 << fBool},
	numberKind:    {want: "a number", formats: 1<<fInt | 1<<fUint | 1<<fFloat},
	intKind:       {want: "an integer", formats: 1<<fInt | 1<<fUint},
	uintKind:      {want: "a non-negative integer", formats: 1<<fInt | 1<<fUint},
	stringsKind:   {want: "an array of strings", formats: 1 << fArray, elem: stringKind},
	stringMapKind: {want: "a map of strings", formats: 1 << fMap, elem: stringKind},
	valueKind:     {formats: ^uint16(1 << fExt), elem: valueKind},
	bytesKind:     {want: "binary data", formats: 1<<fBin | 1<<fStr},
	filesKind:     {want: "an array of maps", formats: 1 << fArray, elem: fileKind},
	fileKind:      {want: "a map", formats: 1 << fMap, fields: fileFields},
	jobKind:       {want: "a map", formats: 1 << fMap, fields: jobFields},
	eventKind:     {want: "a map", formats: 1 << fMap, fields: eventFields},
}

// kindOf maps the Go type of each field of a message to its kind.
var kindOf = map[reflect.Type]kind{
	reflect.TypeFor[string]():            stringKind,
	reflect.TypeFor[bool]():              boolKind,
	reflect.TypeFor[float64]():           numberKind,
	reflect.TypeFor[int]():               intKind,
	reflect.TypeFor[int64]():             intKind,
	reflect.TypeFor[uint64]():            uintKind,
	reflect.TypeFor[[]string]():          stringsKind,
	reflect.TypeFor[map[string]string](): stringMapKind,
	reflect.TypeFor[value]():             valueKind,
	reflect.TypeFor[[]byte]():            bytesKind,
	reflect.TypeFor[[]File]():            filesKind,
	reflect.TypeFor[File]():              fileKind,
}

var (
	jobFields   = fieldKinds(reflect.TypeFor[Job]())
	eventFields = fieldKinds(reflect.TypeFor[eventWire]())
	fileFields  = fieldKinds(reflect.TypeFor[File]())
)

// fieldKinds maps the msgpack name of each field of struct type t to its
// kind, that of what a pointer field points to (a test checks that every
// field has one).
func fieldKinds(t reflect.Type) map[string]kind {
	m := make(map[string]kind, t.NumField())
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("msgpack"), ",")
		if f.Type.Kind() == reflect.Pointer {
			f.Type = f.Type.Elem()
		}
		m[name] = kindOf[f.Type]
	}
	return m
}

// scan walks b without allocating and checks that it holds exactly one
// msgpack value, a map; that no string, binary or extension is longer than
// the bytes left, and no array or map announces more elements than bytes are
// left (every element takes at least one byte); that arrays and maps nest at
// most maxDepth deep; and that the map, of kind k, and its known fields hold
// what their kinds allow, as strictly as encoding/json would: no integer
// from a float, no string that is not UTF-8, no NaN but in data. After it, the library
// allocates in proportion to len(b), whatever lengths b announces.
//
// An error in the structure of b wins over an error in the type of a field,
// wherever the two are.
func scan(b []byte, k kind) error {
	if len(b) == 0 {
		return errors.New("empty input")
	}
	if f, _, _ := classify(b[0]); f != fMap {
		if b[0] == '{' {
			return errors.New("want a map at the top, got the byte '{', which starts a JSON object (is the Content-Type header wrong?)")
		}
		return fmt.Errorf("want a map at the top, got %s", describeCode(b[0]))
	}
	s := scanner{b: b}
	err := s.value(k, 0)
	if err == nil && s.pos != len(b) {
		return fmt.Errorf("at byte %d: %d bytes of trailing data after the message", s.pos, len(b)-s.pos)
	}
	if s.badType {
		if structural := scan(b, anyKind); structural != nil {
			return structural
		}
		slices.Reverse(s.path)
		return fmt.Errorf("%s%w", strings.Join(s.path, ""), err)
	}
	return err
}

// scanner is the state of scan.
type scanner struct {
	b       []byte
	pos     int
	data    []byte   // the data of the last value, such as the bytes of a string
	badType bool     // the error is about a type, not the structure
	path    []string // where the type error is, from the inside out
}

// value checks the value at s.pos, of kind k, inside depth arrays and maps.
func (s *scanner) value(k kind, depth int) error {
	start := s.pos
	if start == len(s.b) {
		return truncated(start)
	}
	c := s.b[start]
	f, size, lenSize := classify(c)
	if f == fInvalid {
		return fmt.Errorf("at byte %d: 0x%02x is not a msgpack type code", start, c)
	}
	s.pos++
	if lenSize > 0 {
		if len(s.b)-s.pos < lenSize {
			return truncated(start)
		}
		size += uintOf(s.b[s.pos : s.pos+lenSize])
		s.pos += lenSize
	}
	n := uint64(0) // values inside
	if f == fArray || f == fMap {
		n, size = size<<(f-fArray), 0 // a map holds a key and a value for each entry
	}
	if rest := uint64(len(s.b) - s.pos); size > rest {
		return fmt.Errorf("at byte %d: %s of %d bytes runs past the end of the input (%d left): the message is truncated", start, describeCode(c), size, rest)
	} else if n > rest {
		what := fmt.Sprintf("an array of %d elements", n)
		if f == fMap {
			what = fmt.Sprintf("a map of %d entries", n/2)
		}
		return fmt.Errorf("at byte %d: %s cannot fit in the %d bytes left: the message is truncated or the length is wrong", start, what, rest)
	}
	s.data = s.b[s.pos : s.pos+int(size)]
	s.pos += int(size)
	if k != anyKind {
		if err := check(k, f, c, s.data); err != nil {
			s.badType = true
			return err
		}
	}
	switch {
	case n == 0:
		return nil
	case depth >= maxDepth:
		return fmt.Errorf("at byte %d: arrays and maps nest deeper than %d levels", start, maxDepth)
	case f == fArray:
		return s.elements(k, int(n), depth+1)
	}
	return s.entries(k, int(n/2), depth+1)
}

// elements checks the n elements of an array of kind k.
func (s *scanner) elements(k kind, n, depth int) error {
	where := "element %d: "
	if k == valueKind || k == anyKind {
		where = "[%d]: "
	}
	for i := range n {
		if err := s.value(kinds[k].elem, depth); err != nil {
			return s.at(err, where, i)
		}
	}
	return nil
}

// entries checks the n entries of a map of kind k.
func (s *scanner) entries(k kind, n, depth int) error {
	key, elem, fields, where := keyKind, kinds[k].elem, kinds[k].fields, "key %s: "
	switch {
	case k == valueKind || k == anyKind:
		where = "[%s]: "
	case fields != nil:
		where = "field %s: "
	}
	if k == anyKind {
		key = anyKind
	}
	for i := range n {
		if err := s.value(key, depth); err != nil {
			return s.at(err, "key %d: ", i)
		}
		name := s.data
		if fields != nil {
			elem = fields[string(name)]
		}
		if err := s.value(elem, depth); err != nil {
			return s.at(err, where, quote(string(name)))
		}
	}
	return nil
}

// at notes where the type error err is, for scan to put in front of it once
// (wrapping it at each level would take time in the square of the depth);
// an error in the structure says where it is already.
func (s *scanner) at(err error, format string, where any) error {
	if s.badType {
		s.path = append(s.path, fmt.Sprintf(format, where))
	}
	return err
}

// check checks that a value of format f, code c and data holds what kind k
// allows. Nil is allowed everywhere but in a map key: it leaves a field empty.
func check(k kind, f format, c byte, data []byte) error {
	if f == fNil && k != keyKind {
		return nil
	}
	if kinds[k].formats&(1<<f) == 0 {
		switch k {
		case keyKind:
			return fmt.Errorf("map keys must be strings, got %s", formatNames[f])
		case valueKind:
			return fmt.Errorf("got %s, which JSON cannot carry", formatNames[f])
		}
		return fmt.Errorf("want %s, got %s", kinds[k].want, formatNames[f])
	}
	switch {
	case k == intKind && f == fUint && uintOf(data) > math.MaxInt64:
		return fmt.Errorf("%d is too large for a signed 64-bit integer", uintOf(data))
	case k == uintKind && f == fInt && intOf(c, data) < 0:
		return fmt.Errorf("%d is negative, want a non-negative integer", intOf(c, data))
	case f == fFloat && k == valueKind:
		return nil // NaN and infinities are data (see Event.Data)
	case f == fFloat:
		x := math.Float64frombits(uintOf(data))
		if c == msgpcode.Float {
			x = float64(math.Float32frombits(uint32(uintOf(data))))
		}
		return checkFinite(x)
	case (f == fStr || f == fBin) && k != bytesKind && !utf8.Valid(data):
		return fmt.Errorf("string %s is not valid UTF-8", quote(string(data)))
	}
	return nil
}

// A format is the msgpack type of a value, as the code that starts it says.
type format uint8

const (
	fInvalid format = iota
	fNil
	fBool
	fInt // signed: a fixnum or int8 to int64
	fUint
	fFloat
	fStr
	fBin
	fExt
	fArray // fMap must follow
	fMap
)

var formatNames = [...]string{fNil: "nil", fBool: "a boolean", fInt: "an integer", fUint: "an integer", fFloat: "a float",
	fStr: "a string", fBin: "binary data", fExt: "an extension type", fArray: "an array", fMap: "a map"}

// classify says what code c starts: its format and how long it is. size is
// the number of data bytes after the code, or, for an array or a map, of
// entries; lenSize, when not zero, is the number of bytes after the code that
// hold a length to add to size.
func classify(c byte) (f format, size uint64, lenSize int) {
	switch {
	case msgpcode.IsFixedNum(c):
		return fInt, 0, 0
	case msgpcode.IsFixedMap(c):
		return fMap, uint64(c & msgpcode.FixedMapMask), 0
	case msgpcode.IsFixedArray(c):
		return fArray, uint64(c & msgpcode.FixedArrayMask), 0
	case msgpcode.IsFixedString(c):
		return fStr, uint64(c & msgpcode.FixedStrMask), 0
	case c == msgpcode.Nil:
		return fNil, 0, 0
	case c == msgpcode.False || c == msgpcode.True:
		return fBool, 0, 0
	case c == msgpcode.Float || c == msgpcode.Double:
		return fFloat, 4 << (c - msgpcode.Float), 0
	case c >= msgpcode.Uint8 && c <= msgpcode.Uint64:
		return fUint, 1 << (c - msgpcode.Uint8), 0
	case c >= msgpcode.Int8 && c <= msgpcode.Int64:
		return fInt, 1 << (c - msgpcode.Int8), 0
	case c >= msgpcode.FixExt1 && c <= msgpcode.FixExt16:
		return fExt, 1 + 1<<(c-msgpcode.FixExt1), 0 // a type byte and the data
	case c >= msgpcode.Ext8 && c <= msgpcode.Ext32:
		return fExt, 1, 1 << (c - msgpcode.Ext8)
	case c >= msgpcode.Bin8 && c <= msgpcode.Bin32:
		return fBin, 0, 1 << (c - msgpcode.Bin8)
	case c >= msgpcode.Str8 && c <= msgpcode.Str32:
		return fStr, 0, 1 << (c - msgpcode.Str8)
	case c == msgpcode.Array16 || c == msgpcode.Array32:
		return fArray, 0, 2 << (c - msgpcode.Array16)
	case c == msgpcode.Map16 || c == msgpcode.Map32:
		return fMap, 0, 2 << (c - msgpcode.Map16)
	}
	return fInvalid, 0, 0
}

// describeCode names the msgpack type of code c for an error message.
func describeCode(c byte) string {
	if f, _, _ := classify(c); f != fInvalid {
		return formatNames[f]
	}
	return fmt.Sprintf("the invalid code 0x%02x", c)
}

// uintOf reads a big-endian unsigned integer of 1, 2, 4 or 8 bytes.
func uintOf(b []byte) uint64 {
	var u uint64
	for _, c := range b {
		u = u<<8 | uint64(c)
	}
	return u
}

// intOf reads the signed integer of code c (a fixnum or int8 to int64).
func intOf(c byte, data []byte) int64 {
	if msgpcode.IsFixedNum(c) {
		return int64(int8(c))
	}
	shift := 64 - 8*len(data)
	return int64(uintOf(data)<<shift) >> shift
}

func truncated(pos int) error {
	return fmt.Errorf("at byte %d: unexpected end of input: the message is truncated", pos)
}

// jobWire decodes a job. In msgpack, its timeout_sec shadows the Job's and
// decodes as a number, where the library would wrap an unsigned integer
// above math.MaxInt64 around to a negative float. JSON decodes into the Job.
type jobWire struct {
	TimeoutSec number `msgpack:"timeout_sec"`
	Job        `msgpack:",inline"`
}

func (w *jobWire) job() *Job {
	j := &w.Job
	if w.TimeoutSec != 0 {
		j.TimeoutSec = float64(w.TimeoutSec)
	}
	j.RequiredSecrets, j.Metadata = orNil(j.RequiredSecrets), orNil(j.Metadata)
	j.Files, j.Artifacts = orNil(j.Files), orNil(j.Artifacts)
	return j
}

// orNil returns nil for an empty slice or map: a decoder gives empty ones for
// [] and {}, which a decoded job or event holds as nil.
func orNil[T ~[]string | ~[]File | ~map[string]string](v T) T {
	if len(v) == 0 {
		return nil
	}
	return v
}

// number is a float64 that decodes from any msgpack integer as it is.
type number float64

func (n *number) DecodeMsgpack(dec *msgpack.Decoder) error {
	v, err := dec.DecodeInterfaceLoose()
	switch v := v.(type) {
	case uint64:
		*n = number(v)
	case int64:
		*n = number(v)
	case float64:
		*n = number(v)
	}
	return err
}
