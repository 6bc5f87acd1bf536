"""Process plumbing that knows nothing of records or diagnoses: ``ratelog`` (rate-limited
warnings), ``heap`` (malloc thresholds, garbage collection, huge pages), ``native`` (where the
built libraries and binaries are), ``signals`` (SIGTERM/SIGHUP unwind like Ctrl-C),
``texttable`` (plain-text tables), ``stacks`` (a live process's stacks through py-spy, gdb or
eu-stack) and ``stacks_view`` (those stacks in the live view and the report). Every other
package may import it; it imports nothing of c4d.
"""
