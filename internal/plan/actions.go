package plan

// The actions of a change as the plan JSON lists them ("actions": ["delete", "create"]).
const (
	actNoop   = "no-op"
	actCreate = "create"
	actRead   = "read"
	actUpdate = "update"
	actDelete = "delete"
	actForget = "forget"
)

// actionList is a change's actions, in the order the plan lists them.
type actionList []string

func (a actionList) is(acts ...string) bool {
	if len(a) != len(acts) {
		return false
	}
	for i := range a {
		if a[i] != acts[i] {
			return false
		}
	}
	return true
}

// NoOp reports a change that changes nothing.
func (a actionList) NoOp() bool { return a.is(actNoop) }

// Create reports a create.
func (a actionList) Create() bool { return a.is(actCreate) }

// Read reports a data source read.
func (a actionList) Read() bool { return a.is(actRead) }

// Update reports an in-place update.
func (a actionList) Update() bool { return a.is(actUpdate) }

// Delete reports a delete.
func (a actionList) Delete() bool { return a.is(actDelete) }

// Forget reports a removal from state that leaves the object alone.
func (a actionList) Forget() bool { return a.is(actForget) }

// DestroyBeforeCreate reports a replace that deletes the old object first.
func (a actionList) DestroyBeforeCreate() bool { return a.is(actDelete, actCreate) }

// CreateBeforeDestroy reports a replace that creates the new object first.
func (a actionList) CreateBeforeDestroy() bool { return a.is(actCreate, actDelete) }
