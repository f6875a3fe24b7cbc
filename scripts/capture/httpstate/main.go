// Command httpstate is a minimal state server for OpenTofu's built-in "http" backend, used only
// by scripts/capture/tofu.sh to record what `tofu force-unlock -force ID` prints when it
// succeeds (the local backend can never force-unlock: its lock belongs to the process holding
// it). It listens on 127.0.0.1 only, prints its address on the first line of stdout and
// serves until killed:
//
//	GET/POST/DELETE /state  the state (404 while there is none)
//	LOCK/UNLOCK     /lock   the lock (423 with the holder's info while locked); UNLOCK always
//	                        succeeds, as force-unlock expects from a backend whose lock exists
package main

import (
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"sync"
)

func main() {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(ln.Addr().String())
	var (
		mu          sync.Mutex
		state, lock []byte
	)
	http.HandleFunc("/state", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		switch r.Method {
		case http.MethodGet:
			if state == nil {
				http.NotFound(w, r)
				return
			}
			_, _ = w.Write(state)
		case http.MethodPost:
			b, err := io.ReadAll(r.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			state = b
		case http.MethodDelete:
			state = nil
		default:
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		}
	})
	http.HandleFunc("/lock", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		switch r.Method {
		case "LOCK":
			if lock != nil {
				w.WriteHeader(http.StatusLocked)
				_, _ = w.Write(lock)
				return
			}
			b, err := io.ReadAll(r.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			lock = b
		case "UNLOCK":
			lock = nil
		default:
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		}
	})
	log.Fatal(http.Serve(ln, nil))
}
