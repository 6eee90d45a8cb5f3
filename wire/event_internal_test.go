package wire

import (
	"reflect"
	"strings"
	"testing"
)

// TestEventWireFollowsEvent keeps eventWire, the encoded form, in step with
// Event: the same fields in the same order, with the same names on the wire.
func TestEventWireFollowsEvent(t *testing.T) {
	et, wt := reflect.TypeFor[Event](), reflect.TypeFor[eventWire]()
	if et.NumField() != wt.NumField() {
		t.Fatalf("Event has %d fields, eventWire %d", et.NumField(), wt.NumField())
	}
	name := func(f reflect.StructField, tag string) string {
		n, _, _ := strings.Cut(f.Tag.Get(tag), ",")
		return n
	}
	for i := range et.NumField() {
		ef, wf := et.Field(i), wt.Field(i)
		if ef.Name != wf.Name {
			t.Errorf("field %d: Event.%s, eventWire.%s", i, ef.Name, wf.Name)
		}
		for _, tag := range []string{"json", "msgpack"} {
			if name(ef, tag) != name(wf, tag) {
				t.Errorf("field %s: %s name %q in Event, %q in eventWire", ef.Name, tag, name(ef, tag), name(wf, tag))
			}
		}
		if name(ef, "json") != name(ef, "msgpack") {
			t.Errorf("field %s: json name %q, msgpack name %q", ef.Name, name(ef, "json"), name(ef, "msgpack"))
		}
	}
}

// TestEveryFieldIsChecked keeps the type checks of a msgpack message in step
// with the fields: a field of a kind scan does not know would go unchecked,
// and the library would convert what it holds silently.
func TestEveryFieldIsChecked(t *testing.T) {
	for name, fields := range map[string]map[string]kind{"Job": jobFields, "eventWire": eventFields, "File": fileFields} {
		for field, k := range fields {
			if k == anyKind {
				t.Errorf("%s field %q has no kind for scan to check", name, field)
			}
		}
	}
	if len(jobFields) != reflect.TypeFor[Job]().NumField() || len(eventFields) != reflect.TypeFor[eventWire]().NumField() {
		t.Errorf("%d job fields, %d event fields: two fields share a msgpack name", len(jobFields), len(eventFields))
	}
}
