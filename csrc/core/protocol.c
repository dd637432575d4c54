/*
 * protocol.c - the pyshmlock protocol: every decision made on the shared
 * state word.  Read admission, exclusive claims and their drain, phase
 * fairness, and the releases; the pause gate's own steps are gate.c's and
 * update sessions session.c's.  Sleeping is wait.c's; a dead process's
 * leftovers are reclaimed by slots.c.  Longer than the other files because
 * the binding's fast calls (shl_fast_*) are here beside the steps they
 * write straight: the same [model:] steps, in the same orders, read
 * together.
 *
 * ======================================================================
 *  Protocol overview (docs/DESIGN.md has the long form and the proofs)
 * ======================================================================
 *
 * One POSIX shared-memory segment "/pyshmlock.<name>" holds:
 *
 *   header   magic, layout version, sizes, max_processes (fixed by the
 *            creator), the SLOTS' HIGH-WATER MARK, the 32-bit STATE WORD,
 *            the DRAIN COUNTER, and observability fields (who paused,
 *            recovery log).
 *   slots    max_processes per-process records.  A process owns exactly one
 *            slot per lock it has open.  All per-process state lives in the
 *            slot: its read-hold count, its queued ("owed") readers, and a
 *            robust process-shared mutex that says whether the owner lives.
 *
 * The state word (all gate decisions are made on it, atomically):
 *
 *   bits  0-11  OWNER     slot index + 1 of the exclusive claimant (0: none)
 *   bit     12  UPDATE    the claim is an update (pins the pause)
 *   bit     13  GRANTED   the claim has finished waiting for readers
 *   bit     14  PAUSED    no new read hold is granted anywhere
 *   bit     15  SLEEPERS  someone sleeps on the state word (futex)
 *   bit     16  DRAINERS  someone sleeps on the drain counter (futex)
 *   bit     17  PINNED    an update session pins the pause (see below)
 *   bit     18  SUSPECT   the protected data is suspect (see below)
 *   bits 19-31  EPOCH     counts exclusive claims (wraps)
 *
 * Read admission is a Dekker handshake between a reader and the exclusive
 * claimant, with sequentially consistent operations on both sides:
 *
 *   reader:   slot.readers += 1 ; s = load(state) ;
 *             admitted if !PAUSED && OWNER == 0 (or the owed-reader rule)
 *             otherwise slot.readers -= 1 and wait.
 *             (A slot that already counts SHL_READ_HOLDS_MAX fails with
 *             SHL_EOVERFLOW instead: the 32-bit count never wraps.)
 *   writer:   CAS(state: OWNER = me) ; n = load(slots_hwm) ;
 *             then scan slot.readers of slots [0, n).
 *
 * In the single total order of seq_cst operations either the reader's load
 * follows the claim (it sees OWNER and backs out) or the writer's scan
 * follows the increment (it sees the reader and waits).  Both cannot miss.
 * The same handshake makes pause() atomic against admission.
 *
 * Scans are bounded by the slots' high-water mark (1 + the highest slot
 * index ever attached), so their cost follows the processes ever attached,
 * not max_processes.  A process raises the mark (seq_cst fetch-max) when it
 * takes its slot, before the slot holds any registration; every scanner
 * loads it (seq_cst) after its own operation on the state word, and clamps
 * it to the validated max.  A reader the scan must count looked at the
 * state before that operation, so its raise came before the scanner's load
 * in the total order, and the mark never falls (proof at scan_limit).
 *
 * Phase fairness.  A reader that finds an exclusive claim with epoch E
 * registers in slot.rwait[E & 1] ("owed").  The claimant of a later claim
 * E' waits for every owed reader of parity (E'-1) & 1 before it sets
 * GRANTED, and an owed reader enters E' while it is still draining (not
 * GRANTED, not PAUSED) whenever it is registered under that parity (or
 * E' != its epoch).  Entry never depends on epoch equality alone: the
 * 13-bit epoch wraps (2^13 claims under a pause can pass one waiting
 * reader), and a claim that waits for a reader always lets it in.  So a
 * reader waits through at most one exclusive phase (two if it registered
 * too late for a claim's count; pauses excepted); a writer waits through at most the
 * readers present or owed when it claimed.  After setting GRANTED the writer
 * scans the reader counts once more (second Dekker pair), so a late owed
 * reader that slipped in is waited for, never overlapped.
 *
 * Update sessions.  A session is an update pin owned by a token, not by a
 * process: it begins in one process and may end in another.  PINNED in
 * the state word is the session's existence; the header's session_token
 * and deadline say which one and until when.  Begin: under an update hold
 * (so every reader was drained or is frozen by a pause), pause, write the
 * token and deadline, then set PINNED (session.c, session_pin).  While
 * PINNED is set resume waits, exactly as for UPDATE, so the gate stays
 * shut between the session's update calls whichever processes make them;
 * each of those calls is an ordinary update hold, granted at once under
 * the pause.  End (any process), or expiry past the deadline (the lease
 * watchdog of any attached process, or a waiter): a CAS of the token word
 * from the session's token to "ending by slot i" decides who ends it, and
 * only that process clears PINNED (its slot's recovery does, if it dies in
 * between).  A new session pins only once PINNED is clear, so no end can
 * clear a later session's pin.  An expiry marks the data suspect with the
 * CAS that unpins: the pause stays, and resume refuses (SHL_ESUSPECT) until
 * a completed update or a forced resume clears the mark.
 *
 * The data-suspect mark.  SUSPECT is set by the CAS that ends what was
 * lost (the reclaim of a granted hold, an expired session's unpin) and
 * cleared by the CAS that ends what rewrote the data (a release, a
 * session's end, a forced resume).  Being a bit of the state word, it is
 * part of the value every CAS compares: a resume decides on the word it
 * loaded and opens the gate with a CAS from it, so a mark made after its
 * look makes the CAS fail, however often the epoch wrapped meanwhile.
 *
 * Waiting uses Linux futexes on shared (not private) words.  A waiter sets
 * SLEEPERS or DRAINERS before it sleeps; whoever changes a condition that a
 * sleeper may wait for clears the bit and wakes all.  No FUTEX_WAKE is
 * issued when no bit is set, so the uncontended paths make no system call.
 * ====================================================================== */
#include "internal.h"

/* --------------------------------------------------------------- scanning */

/*
 * How many slots a scan must look at: the slots' high-water mark, so that
 * an exclusive acquire costs what the processes ever attached cost, not
 * max_processes.  The mark is shared memory, so it is clamped to the
 * validated private max (a corrupt large value costs a full scan, never an
 * out-of-bounds index).
 *
 * Why no announced reader is missed (the Dekker pair of the top comment,
 * extended by one operation on each side).  A reader in slot i raised the
 * mark to at least i + 1 (seq_cst, raise_slots_hwm) before its seq_cst
 * increment of slot.readers or slot.rwait, in program order, so before it
 * in the single total order S.  A scanner loads the mark (seq_cst) after
 * its own seq_cst operation on the state word (the claim CAS, the GRANTED
 * CAS, or arming DRAINERS).  Take a reader that the scan must count: its
 * seq_cst load of the state word did not see the scanner's operation (else
 * it backs out or registers for a later phase, and need not be counted), so
 * it precedes that operation in S.  Then
 *   raise(i) <S increment <S reader's state load <S scanner's state op
 *            <S scanner's mark load,
 * and the mark never falls, so the scanner's load returns at least i + 1:
 * slot i is scanned, and its load of slot.readers follows the increment in
 * S, so it sees it.  A slot reused after a death or by a forked child is
 * below the mark already (attach_slot raises it again, harmlessly).
 * (Strictly, the raise need only precede the reader's look at the state;
 * attach_slot puts it before anything the slot can hold.  The model has
 * both steps, ATTACH_HWM and SCAN_HWM, and catches a raise after the look
 * and a bound loaded before the claim.)
 */
uint32_t scan_limit(shl_lock *h)
{
    uint32_t n = atomic_load_explicit(&h->hdr->slots_hwm, memory_order_seq_cst); /* [model:SCAN_HWM] */
    return n < h->max ? n : h->max;
}

static uint64_t sum_readers(shl_lock *h)
{
    uint64_t n = 0;
    uint32_t lim = scan_limit(h);
    for (uint32_t i = 0; i < lim; i++)
        n += atomic_load_explicit(&h->slots[i].readers, memory_order_seq_cst);
    return n;
}

static uint64_t sum_owed(shl_lock *h, uint32_t parity)
{
    uint64_t n = 0;
    uint32_t lim = scan_limit(h);
    for (uint32_t i = 0; i < lim; i++)
        n += atomic_load_explicit(&h->slots[i].rwait[parity], memory_order_seq_cst);
    return n;
}

/* Clear DRAINERS and wake the drain sleepers, if there are any. */
void wake_drainers(shl_lock *h)
{
    struct shl_header *hd = h->hdr;
    /* seq_cst load: in a release this load follows the seq_cst decrement of
     * slot.readers; with the drainer's "set DRAINERS, then scan" it forms
     * the Dekker pair that makes a lost drain wake-up impossible. */
    uint32_t s = atomic_load_explicit(&hd->state, memory_order_seq_cst);
    while (s & ST_DRAINERS) {   /* [model:WAKE_DRAINERS] */
        if (atomic_compare_exchange_weak_explicit(&hd->state, &s, s & ~ST_DRAINERS,
                                                  memory_order_seq_cst,
                                                  memory_order_seq_cst)) {
            /* Bump after clearing: a drainer that re-arms in between read the
             * old counter value first, so its futex wait sees the change. */
            atomic_fetch_add_explicit(&hd->drain_seq, 1, memory_order_seq_cst);
            futex_wake_all(&hd->drain_seq);
            return;
        }
    }
}

/* ----------------------------------------------------------- the attempts */

/* Would this attempt wait for an exclusive hold that its own thread owns?
 * Not for asyncio attempts, where another task of the thread may release. */
/* held_excl is loaded with acquire before excl_thread: a non-zero value
 * comes from grant_exclusive's release store (or release_exclusive's
 * restore), which follows its store of excl_thread, so we see that thread
 * or a later grantee, never the thread of an older hold.  With both loads
 * relaxed, arm64 could pair a new grant's held_excl with the previous
 * holder's excl_thread: a false SHL_EDEADLK for the previous holder. */
int excl_is_this_thread(shl_lock *h, const shl_waiter *w)
{
    return !w->shared_thread &&
           atomic_load_explicit(&h->held_excl, memory_order_acquire) != 0 &&
           atomic_load_explicit(&h->excl_thread, memory_order_relaxed) ==
               this_thread();
}

/* Take back this waiter's owed-reader registrations (one per parity it
 * registered under), then wake the drainers that may wait for them. */
static void withdraw_owed(shl_lock *h, shl_waiter *w)
{
    struct shl_slot *me = &h->slots[self_slot(h)];
    for (uint32_t p = 0; p < 2; p++)
        if (w->registered & (1u << p))
            atomic_fetch_sub_explicit(&me->rwait[p], 1, memory_order_seq_cst); /* [model:WITHDRAW_OWED] */
    w->registered = 0;
    wake_drainers(h);
}

void wait_on_state(shl_waiter *w, uint32_t s)
{
    w->on_drain = 0;
    w->expect = s;
}

static int try_read(shl_lock *h, shl_waiter *w)
{
    struct shl_slot *me = &h->slots[self_slot(h)];
    /* Announce, then look (reader half of the Dekker pair; see the top). */
    uint32_t prev = atomic_fetch_add_explicit(&me->readers, 1, memory_order_seq_cst); /* [model:READ_ANNOUNCE] */
    uint32_t s = atomic_load_explicit(&h->hdr->state, memory_order_seq_cst); /* [model:READ_LOOK] */
    if (__builtin_expect(prev >= SHL_READ_HOLDS_MAX, 0)) {
        /* Never let the count wrap (a writer would see 0 beside our holds).
         * Attempts in flight add at most one each, far below 2^31. */
        if (atomic_fetch_sub_explicit(&me->readers, 1, memory_order_seq_cst) == 1)
            wake_drainers(h);
        return SHL_EOVERFLOW;
    }
    if (__builtin_expect((s & (ST_PAUSED | ST_OWNER)) == 0, 1))
        goto granted;
    /* Owed reader: the current claim is still waiting for readers, and
     * either it waits for us (we are registered under the parity it counts,
     * (epoch - 1) & 1; see drain_for_exclusive) or it came later than the
     * phase we queued behind.  The first test alone decides liveness: a
     * claim that waits for us always lets us in, so no epoch value, however
     * often the 13-bit epoch wrapped during our wait, can make it wait for a
     * reader that refuses to enter.  The epoch comparison alone could (a
     * wrap makes a later claim look like ours).  The second test only lets
     * us in sooner. */
    if (!(s & (ST_PAUSED | ST_GRANTED)) && w->registered &&
        ((w->registered & (1u << ((ST_EPOCH(s) - 1u) & 1u))) || ST_EPOCH(s) != w->my_epoch))
        goto granted;

    if (atomic_fetch_sub_explicit(&me->readers, 1, memory_order_seq_cst) == 1) /* [model:READ_BACKOUT] */
        wake_drainers(h);
    int32_t o = owner_index(h, s);
    if (o == -2)
        return SHL_ECORRUPT;
    if (o == self_slot(h) && excl_is_this_thread(h, w))
        return SHL_EDEADLK;
    if (o >= 0 && !w->registered) {
        /* [model:READ_REGISTER] queue as owed behind the phase of epoch s */
        w->my_epoch = ST_EPOCH(s);
        atomic_fetch_add_explicit(&me->rwait[w->my_epoch & 1], 1, memory_order_seq_cst);
        w->registered = 1u << (w->my_epoch & 1);
    } else if (o >= 0 && (s & ST_GRANTED) && !(w->registered & (1u << (ST_EPOCH(s) & 1)))) {
        /* [model:READ_REQUEUE] A later claim was granted before we got in
         * (we registered after its claimant counted the owed readers).  Also
         * register under that claim's epoch, so that the claim after it
         * waits for us: then we wait through that one phase only.
         * Add, never move: s may be stale, and the next claim may already
         * have counted the parity we registered first.  Taking that
         * registration away would let the claim after it pass us too, a
         * third phase (the model check found exactly that).  Registrations
         * only ever added keep the bound at two phases. */
        w->my_epoch = ST_EPOCH(s);
        atomic_fetch_add_explicit(&me->rwait[w->my_epoch & 1], 1, memory_order_seq_cst);
        w->registered |= 1u << (w->my_epoch & 1);
    }
    wait_on_state(w, s);
    return SHL_AGAIN;

granted:
    if (w->registered)   /* [model:READ_ADMIT_OWED] */
        withdraw_owed(h, w);
    atomic_fetch_add_explicit(&h->held_reads, 1, memory_order_relaxed);
    return SHL_OK;
}

/* Set DRAINERS (if needed) and return the state seen after it is set. */
static uint32_t arm_drainers(shl_lock *h)
{
    uint32_t s = atomic_load_explicit(&h->hdr->state, memory_order_seq_cst);
    while (!(s & ST_DRAINERS)) {   /* [model:DRAIN_ARM] (also try_wait_drained's) */
        if (atomic_compare_exchange_weak_explicit(&h->hdr->state, &s, s | ST_DRAINERS,
                                                  memory_order_seq_cst, memory_order_seq_cst))
            return s | ST_DRAINERS;
    }
    return s;
}

static void grant_exclusive(shl_lock *h, int kind)
{
    /* excl_thread first, then held_excl with release: see excl_is_this_thread. */
    atomic_store_explicit(&h->excl_thread, this_thread(), memory_order_relaxed);
    atomic_store_explicit(&h->held_excl, kind, memory_order_release);
    atomic_store_explicit(&h->hdr->exclusive_pid, h->pid, memory_order_relaxed);
}

/* The claimant waits for owed readers, sets GRANTED, then waits for the
 * readers counted in the slots (see "Phase fairness" at the top).
 *
 * DRAINERS is set only when a scan found someone to wait for, and then the
 * scan is made again before sleeping (arm, then scan: the Dekker pair with
 * a leaving reader's "decrement, then look for DRAINERS" in wake_drainers).
 * A claim that finds nobody leaves the bit as it was: arming it on every
 * claim would make the next release of a last read hold clear it, bump
 * drain_seq and make a futex system call for nobody (a write, then a read,
 * uncontended, paid one each). */
static int drain_for_exclusive(shl_lock *h, shl_waiter *w)
{
    struct shl_header *hd = h->hdr;
    int update = w->kind == SHL_KIND_UPDATE;
    /* Read the counter before arming and scanning: a reader that leaves
     * after our scan bumps it, so the futex wait cannot miss that. */
    uint32_t seq = atomic_load_explicit(&hd->drain_seq, memory_order_seq_cst); /* [model:DRAIN_SEQ] */
    uint32_t s = atomic_load_explicit(&hd->state, memory_order_seq_cst); /* [model:DRAIN_LOOK] */
    int armed = 0;
    for (;;) {
        if (owner_of(s) != (uint32_t)self_slot(h) + 1)
            return SHL_ECORRUPT;   /* nobody else may clear a live claim */
        if (!(s & ST_GRANTED)) {
            if (!(s & ST_PAUSED) && sum_owed(h, (w->claim_epoch + 1) & 1) > 0) { /* [model:DRAIN_OWED_SCAN] */
                if (armed)
                    break;         /* sleep on drain_seq */
                s = arm_drainers(h);
                armed = 1;
                continue;
            }
            if (!atomic_compare_exchange_weak_explicit(&hd->state, &s, s | ST_GRANTED, /* [model:EXCL_GRANT] */
                                                       memory_order_seq_cst, memory_order_seq_cst))
                continue;
            s |= ST_GRANTED;
        }
        /* GRANTED is set (seq_cst); now count readers once more.  A paused
         * lock freezes readers in the application, so an update stops
         * waiting. */
        if ((update && (s & ST_PAUSED)) || sum_readers(h) == 0) {   /* [model:DRAIN_READER_SCAN] */
            w->claimed = 0;   /* from here on a hold, not an attempt */
            grant_exclusive(h, w->kind);
            return SHL_OK;
        }
        if (armed)
            break;
        s = arm_drainers(h);
        armed = 1;
    }
    w->on_drain = 1;
    w->expect = seq;
    return SHL_AGAIN;
}

static int try_exclusive(shl_lock *h, shl_waiter *w)
{
    struct shl_header *hd = h->hdr;
    if (!w->claimed) {
        /* relaxed: only the claim CAS's expected value (it decides) */
        uint32_t s = atomic_load_explicit(&hd->state, memory_order_relaxed);
        uint32_t ns, marks;
        for (;;) {
            int32_t o = owner_index(h, s);
            if (o == -2)
                return SHL_ECORRUPT;
            if (o >= 0) {
                if (o == self_slot(h) && excl_is_this_thread(h, w))
                    return SHL_EDEADLK;
                wait_on_state(w, s);
                return SHL_AGAIN;
            }
            ns = ((s & ~ST_SLEEPERS) + ST_EPOCH_ONE) | ((uint32_t)self_slot(h) + 1);
            /* The marks made so far, read before the claim: a mark made
             * while this claim drains or holds keeps the data suspect past
             * its release (see release_exclusive).  relaxed: a stale count
             * only keeps a mark that this section might have cleared. */
            marks = atomic_load_explicit(&hd->marks, memory_order_seq_cst); /* [model:CLAIM_MARKS] */
            if (w->kind == SHL_KIND_UPDATE) {
                ns |= ST_UPDATE;
                if (s & ST_PAUSED)
                    ns |= ST_GRANTED;   /* readers are frozen: no drain at all */
            }
            /* seq_cst: writer half of the Dekker pair with try_read. */
            if (atomic_compare_exchange_weak_explicit(&hd->state, &s, ns, memory_order_seq_cst,
                                                      memory_order_seq_cst)) /* [model:EXCL_CLAIM] */
                break;
        }
        /* Only the winner of the claim keeps its marks (process-local; read
         * by whichever thread of ours releases).  Under a session's pin it
         * clears nothing at its release. */
        atomic_store_explicit(&h->excl_marks, (s & ST_PINNED) ? EXCL_IN_SESSION : marks,
                              memory_order_relaxed);
        /* Owed readers may enter while we drain: wake the sleepers. */
        if (s & ST_SLEEPERS)
            futex_wake_all(&hd->state);
        w->claimed = 1;
        w->claim_epoch = ST_EPOCH(ns);
        if (ns & ST_GRANTED) {
            w->claimed = 0;   /* from here on a hold, not an attempt */
            grant_exclusive(h, w->kind);
            return SHL_OK;
        }
    }
    return drain_for_exclusive(h, w);
}

static int try_wait_drained(shl_lock *h, shl_waiter *w)
{
    uint32_t seq = atomic_load_explicit(&h->hdr->drain_seq, memory_order_seq_cst);
    arm_drainers(h);
    if (sum_readers(h) == 0)
        return SHL_OK;
    w->on_drain = 1;
    w->expect = seq;
    return SHL_AGAIN;
}

int do_try(shl_lock *h, shl_waiter *w)
{
    int r = ensure_attached(h);
    if (r != SHL_OK)
        return r;
    /* An operator's handle has no slot to count a hold in. */
    if (h->no_slot && w->kind >= SHL_KIND_READ && w->kind <= SHL_KIND_UPDATE)
        return SHL_EINVAL;
    switch (w->kind) {
    case SHL_KIND_READ:     return try_read(h, w);
    case SHL_KIND_WRITE:
    case SHL_KIND_UPDATE:   return try_exclusive(h, w);
    case SHL_KIND_RESUME:   return try_resume(h, w);
    case SHL_KIND_RESUMED:  return try_wait_resumed(h, w);
    case SHL_KIND_DRAINED:  return try_wait_drained(h, w);
    case SHL_KIND_UNPINNED: return try_wait_unpinned(h, w);
    default:                return SHL_EINVAL;
    }
}

int shl_try(shl_lock *h, shl_waiter *w)
{
    RUN_IN_FLIGHT(h, do_try(h, w));
}

/*
 * The binding's fast calls (shmlock.h: shl_fast_handle).  The in-flight
 * bracket keeps a close from unmapping a handle under a call; here the
 * caller guarantees that no close begins during the call (the binding: the
 * GIL, held by these calls throughout and by every shl_close_begin), and it
 * forgets the handle as the close is decided, so the handle is open.  The
 * closed check that remains is a relaxed load of a word only a close
 * changes (ordered by the caller's own serialisation with it): a defence,
 * not the guarantee.
 */
shl_lock *shl_fast_handle(shl_lock *token)
{
    shl_lock *h = handle_of(token);
    if (h == NULL)
        return NULL;
    uint64_t v = atomic_load_explicit(&h->inflight, memory_order_relaxed);
    if (H_GEN(v) != token_gen(token) || (v & (H_CLOSED | H_CLOSING)))
        return NULL;
    return h;
}

static int fast_closed(shl_lock *h)
{
    return h == NULL || (atomic_load_explicit(&h->inflight, memory_order_relaxed) & H_CLOSED);
}

int shl_fast_try(shl_lock *h, shl_waiter *w)
{
    return fast_closed(h) ? SHL_ECLOSED : do_try(h, w);
}

/* try_read without a waiter, for the uncontended case: admitted at once
 * (the gate open, nobody claiming), or backed out with nothing left behind
 * (the caller then makes an attempt, which looks again and may queue). */
/* shl_fast_read's rare steps, out of its line, so that the line makes no
 * call but tail calls (no stack frame to set up). */
static __attribute__((noinline)) int fast_read_reattach(shl_lock *h)
{
    int r = reattach(h);
    return r != SHL_OK ? r : shl_fast_read(h);
}

static __attribute__((noinline)) int fast_read_back_out(shl_lock *h, struct shl_slot *me)
{
    if (atomic_fetch_sub_explicit(&me->readers, 1, memory_order_seq_cst) == 1) /* [model:READ_BACKOUT] */
        wake_drainers(h);
    return SHL_AGAIN;
}

int shl_fast_read(shl_lock *h)
{
    if (fast_closed(h))
        return SHL_ECLOSED;
    if (h->no_slot)
        return SHL_EINVAL;
    if (!attached_here(h))
        return fast_read_reattach(h);
    struct shl_slot *me = &h->slots[self_slot(h)];
    /* The reader half of the Dekker pair, as try_read (same steps). */
    uint32_t prev = atomic_fetch_add_explicit(&me->readers, 1, memory_order_seq_cst); /* [model:READ_ANNOUNCE] */
    uint32_t s = atomic_load_explicit(&h->hdr->state, memory_order_seq_cst); /* [model:READ_LOOK] */
    if (__builtin_expect((s & (ST_PAUSED | ST_OWNER)) == 0 && prev < SHL_READ_HOLDS_MAX, 1)) {
        /* relaxed load and store: only fast calls write gil_reads, and
         * their caller serialises them (see its field) */
        atomic_store_explicit(&h->gil_reads,
                              atomic_load_explicit(&h->gil_reads, memory_order_relaxed) + 1,
                              memory_order_relaxed);
        return SHL_OK;
    }
    return fast_read_back_out(h, me);
}

/*
 * The first try of a fresh exclusive waiter (kind WRITE or UPDATE), as
 * try_exclusive makes it, with the claim written straight for the common
 * case: a word with no claim, pause, pin or sleeper in it.  The same steps
 * in the same order with the same memory orders (CLAIM_MARKS, EXCL_CLAIM,
 * then the drain); any other word, or a claim CAS that loses, goes to
 * try_exclusive, which decides from the word it loads itself.  w is written
 * only when the answer is not SHL_OK: the waiter to go on with after
 * SHL_AGAIN; after an error nothing is left behind (the claim withdrawn).
 */
/* shl_fast_exclusive past its straight line, out of it (so that the line
 * makes no call but tail calls): the attempt's waiter made in w, then
 * try_exclusive (ns 0: no claim made) or the general drain of the claim ns;
 * after an error the claim is withdrawn. */
static __attribute__((noinline)) int fast_exclusive_rest(shl_lock *h, int kind, shl_waiter *w,
                                                         uint32_t ns)
{
    int r;
    if (ns == 0) {
        *w = (shl_waiter){.kind = kind};
        r = try_exclusive(h, w);
    } else {
        *w = (shl_waiter){.kind = kind, .claimed = 1, .claim_epoch = ST_EPOCH(ns)};
        r = drain_for_exclusive(h, w);
    }
    if (r != SHL_OK && r != SHL_AGAIN && w->claimed)
        do_cancel(h, w);
    return r;
}

static __attribute__((noinline)) int fast_exclusive_reattach(shl_lock *h, int kind,
                                                             shl_waiter *w)
{
    int r = reattach(h);
    return r != SHL_OK ? r : shl_fast_exclusive(h, kind, w);
}

int shl_fast_exclusive(shl_lock *h, int kind, shl_waiter *w)
{
    if (fast_closed(h))
        return SHL_ECLOSED;
    if (h->no_slot)             /* an operator's handle has no slot to count a hold in */
        return SHL_EINVAL;
    if (!attached_here(h))
        return fast_exclusive_reattach(h, kind, w);
    struct shl_header *hd = h->hdr;
    /* relaxed: only the claim CAS's expected value (as in try_exclusive) */
    uint32_t s = atomic_load_explicit(&hd->state, memory_order_relaxed);
    if (__builtin_expect(s & (ST_CLAIM_BITS | ST_PAUSED | ST_PINNED | ST_SLEEPERS), 0))
        return fast_exclusive_rest(h, kind, w, 0);
    uint32_t marks = atomic_load_explicit(&hd->marks, memory_order_seq_cst); /* [model:CLAIM_MARKS] */
    uint32_t ns = (s + ST_EPOCH_ONE) | ((uint32_t)self_slot(h) + 1) |
                  (kind == SHL_KIND_UPDATE ? ST_UPDATE : 0);
    /* seq_cst: writer half of the Dekker pair with try_read. */
    if (!atomic_compare_exchange_strong_explicit(&hd->state, &s, ns, memory_order_seq_cst,
                                                 memory_order_seq_cst)) /* [model:EXCL_CLAIM] */
        return fast_exclusive_rest(h, kind, w, 0);
    atomic_store_explicit(&h->excl_marks, marks, memory_order_relaxed);
    /* The drain, straight: the word is taken to be ns, the value our claim
     * wrote (the look of drain_for_exclusive made at once); the GRANTED CAS
     * compares against it, so a word changed since sends us on to the
     * general drain, as a failed CAS of its own would.  No owed reader and
     * no reader: granted, without DRAINERS (we never sleep here). */
    uint32_t claimed = ns;
    if (sum_owed(h, (ST_EPOCH(ns) + 1) & 1) == 0 && /* [model:DRAIN_OWED_SCAN] */
        atomic_compare_exchange_strong_explicit(&hd->state, &ns, ns | ST_GRANTED, /* [model:EXCL_GRANT] */
                                                memory_order_seq_cst, memory_order_seq_cst) &&
        sum_readers(h) == 0) {   /* [model:DRAIN_READER_SCAN] */
        grant_exclusive(h, kind);
        return SHL_OK;
    }
    /* Someone to wait for, or the word changed: the general drain, from
     * its start (DRAIN_SEQ, a look, the scans again, DRAINERS before a
     * sleep). */
    return fast_exclusive_rest(h, kind, w, claimed);
}

void do_cancel(shl_lock *h, shl_waiter *w)
{
    if (self_slot(h) < 0 || atomic_load_explicit(&h->fork_gen, memory_order_acquire) !=
                            atomic_load_explicit(&g_fork_gen, memory_order_relaxed))
        return;   /* the registrations belong to a slot this process no longer has */
    struct shl_header *hd = h->hdr;
    if (w->registered)   /* [model:CANCEL_REGISTERED] */
        withdraw_owed(h, w);
    if (w->claimed) {
        uint32_t s = atomic_load_explicit(&hd->state, memory_order_seq_cst);
        while (owner_of(s) == (uint32_t)self_slot(h) + 1) {   /* [model:CANCEL_CLAIM] */
            if (atomic_compare_exchange_weak_explicit(&hd->state, &s,
                                                      s & ~(ST_CLAIM_BITS | ST_SLEEPERS),
                                                      memory_order_seq_cst,
                                                      memory_order_seq_cst)) {
                if (s & ST_SLEEPERS)
                    futex_wake_all(&hd->state);
                break;
            }
        }
        w->claimed = 0;
    }
}

void shl_cancel(shl_lock *h, shl_waiter *w)
{
    /* A closed handle carries no registration: close refuses while any
     * attempt of ours is registered or claims. */
    if (enter(&h) != SHL_OK)
        return;
    do_cancel(h, w);
    leave(h);
}

/* -------------------------------------------------- releases and the pause */

/* Inlined in full into the fast calls, shl_fast_release_*: no call and no
 * split-off part on the uncontended path. */
#define FAST_INLINE static inline __attribute__((always_inline))

/* The slot's half of a read release: our slot's reader count down by one.
 * SHL_OK, *last set if it was the last reader of the slot (the caller
 * then wakes the drainers: wake_drainers), or SHL_ECORRUPT with nothing
 * changed.  No call, so the fast release stays a leaf. */
FAST_INLINE int drop_slot_read(shl_lock *h, int *last)
{
    struct shl_slot *me = &h->slots[self_slot(h)];
    uint32_t c = atomic_load_explicit(&me->readers, memory_order_relaxed);
    do {
        if (c == 0)     /* our slot was wiped: only a corrupt segment does that */
            return SHL_ECORRUPT;
        /* seq_cst: release half of the drain handshake (see wake_drainers). */
    } while (!atomic_compare_exchange_weak_explicit(&me->readers, &c, c - 1,
                                                    memory_order_seq_cst, memory_order_seq_cst)); /* [model:RELEASE_READ] */
    *last = c == 1;
    return SHL_OK;
}

static int do_release_read(shl_lock *h)
{
    int r = ensure_attached(h);
    if (r != SHL_OK)
        return r;
    uint32_t n = atomic_load_explicit(&h->held_reads, memory_order_relaxed);
    do {
        if (n == 0)
            return SHL_ENOHOLD;
    } while (!atomic_compare_exchange_weak_explicit(&h->held_reads, &n, n - 1,
                                                    memory_order_relaxed, memory_order_relaxed));
    int last;
    r = drop_slot_read(h, &last);
    if (r == SHL_OK && last)
        wake_drainers(h);
    if (r != SHL_OK)
        atomic_fetch_add_explicit(&h->held_reads, 1, memory_order_relaxed);
    return r;
}

int shl_release_read(shl_lock *h)
{
    RUN_IN_FLIGHT(h, do_release_read(h));
}

/* do_release_exclusive's rare steps, out of its line. */
static __attribute__((noinline, cold)) int release_refused(shl_lock *h, int kind)
{
    atomic_store_explicit(&h->held_excl, kind, memory_order_release);
    return SHL_ECORRUPT;
}

/* ns (from the word s, SUSPECT set) as the release's CAS should write it:
 * a completed exclusive section makes the data trustworthy again, as far
 * as the marks made before its claim go (suspect_after); under a session's
 * pin it clears nothing. */
static __attribute__((noinline)) uint32_t release_unmark(shl_lock *h, uint32_t ns)
{
    uint32_t mine = atomic_load_explicit(&h->excl_marks, memory_order_relaxed);
    return mine == EXCL_IN_SESSION ? ns : suspect_after(h, ns, mine); /* [model:RELEASE_UNMARK] */
}

/* do_release_exclusive after its held_excl step: the loop on the word. */
static int release_exclusive_word(shl_lock *h, int kind)
{
    struct shl_header *hd = h->hdr;
    /* The claim bits of our hold: our slot, GRANTED, the UPDATE bit of our kind. */
    const uint32_t ours = ((uint32_t)self_slot(h) + 1) | ST_GRANTED |
                          (kind == SHL_KIND_UPDATE ? ST_UPDATE : 0);
    uint32_t s = atomic_load_explicit(&hd->state, memory_order_seq_cst);
    uint32_t ns;
    do {
        /* [model:RELEASE_OWNER] Ours, granted, of our kind: checked on every
         * value the CAS compares against, not only the first.  Nothing but
         * the recovery of our own (dead) process may clear our claim; a word
         * that names another claimant means a corrupt segment, and clearing
         * its claim would let a third party in beside it. */
        if ((s & ST_CLAIM_BITS) != ours)
            return release_refused(h, kind);
        atomic_store_explicit(&hd->exclusive_pid, 0, memory_order_relaxed);
        ns = s & ~(ST_CLAIM_BITS | ST_SLEEPERS);
        /* (Without SUSPECT in the word the count cannot change the CAS.) */
        if (ns & ST_SUSPECT)
            ns = release_unmark(h, ns);
        /* seq_cst (release at least): everything written under the hold is
         * visible to whoever is admitted next. */
    } while (!atomic_compare_exchange_weak_explicit(&hd->state, &s, ns, memory_order_seq_cst,
                                                    memory_order_seq_cst)); /* [model:EXCL_RELEASE] */
    if (s & ST_SLEEPERS)
        futex_wake_all(&hd->state);
    return SHL_OK;
}

static int do_release_exclusive(shl_lock *h, int kind)
{
    int r = ensure_attached(h);
    if (r != SHL_OK)
        return r;
    int32_t k = kind;
    if (!atomic_compare_exchange_strong_explicit(&h->held_excl, &k, 0, memory_order_relaxed,
                                                 memory_order_relaxed))
        return SHL_ENOHOLD;
    return release_exclusive_word(h, kind);
}

static int release_exclusive(shl_lock *h, int kind)
{
    RUN_IN_FLIGHT(h, do_release_exclusive(h, kind));
}

int shl_release_write(shl_lock *h)  { return release_exclusive(h, SHL_KIND_WRITE); }
int shl_release_update(shl_lock *h) { return release_exclusive(h, SHL_KIND_UPDATE); }

/* do_release_read, taking the hold from the fast calls' count first (a
 * load and a store: see gil_reads), else from the general one. */
/* shl_fast_release_read's rare steps, out of its line (as shl_fast_read's). */
static __attribute__((noinline)) int fast_release_read_rest(shl_lock *h)
{
    return do_release_read(h);     /* (ensure_attached: a fork's child forgets both counts) */
}

static __attribute__((noinline)) int fast_release_read_wake(shl_lock *h)
{
    wake_drainers(h);
    return SHL_OK;
}

int shl_fast_release_read(shl_lock *h)
{
    if (fast_closed(h))
        return SHL_ECLOSED;
    uint32_t g = atomic_load_explicit(&h->gil_reads, memory_order_relaxed);
    if (h->no_slot || !attached_here(h) || g == 0)
        return fast_release_read_rest(h);
    int last;
    if (drop_slot_read(h, &last) != SHL_OK)
        return SHL_ECORRUPT;
    atomic_store_explicit(&h->gil_reads, g - 1, memory_order_relaxed); /* see gil_reads */
    return last ? fast_release_read_wake(h) : SHL_OK;
}

/* do_release_exclusive with the common word written straight: ours,
 * without SUSPECT or SLEEPERS (nothing to unmark, nobody to wake); the
 * same steps (RELEASE_OWNER on the value the CAS compares against,
 * EXCL_RELEASE); anything else, or a CAS that loses, goes to the loop. */
/* do_release_exclusive out of shl_fast_release_exclusive's line, so that
 * the line makes no call but tail calls (no stack frame to set up). */
static __attribute__((noinline)) int fast_release_exclusive_rest(shl_lock *h, int kind)
{
    return do_release_exclusive(h, kind);
}

int shl_fast_release_exclusive(shl_lock *h, int kind)
{
    if (fast_closed(h))
        return SHL_ECLOSED;
    if (h->no_slot || !attached_here(h))
        return fast_release_exclusive_rest(h, kind);
    /* A load and a store, not the CAS of do_release_exclusive: while the
     * hold is ours no grant writes held_excl, and the releases the fast
     * calls' caller makes are serialised by it (the binding makes every
     * release with the GIL held), so no other release runs meanwhile. */
    if (atomic_load_explicit(&h->held_excl, memory_order_relaxed) != kind)
        return SHL_ENOHOLD;
    atomic_store_explicit(&h->held_excl, 0, memory_order_relaxed); /* see above */
    struct shl_header *hd = h->hdr;
    const uint32_t ours = ((uint32_t)self_slot(h) + 1) | ST_GRANTED |
                          (kind == SHL_KIND_UPDATE ? ST_UPDATE : 0);
    uint32_t s = atomic_load_explicit(&hd->state, memory_order_seq_cst);
    if ((s & (ST_CLAIM_BITS | ST_SUSPECT | ST_SLEEPERS)) != ours) /* [model:RELEASE_OWNER] */
        return release_exclusive_word(h, kind);
    atomic_store_explicit(&hd->exclusive_pid, 0, memory_order_relaxed);
    if (!atomic_compare_exchange_strong_explicit(&hd->state, &s, s & ~ST_CLAIM_BITS,
                                                 memory_order_seq_cst,
                                                 memory_order_seq_cst)) /* [model:EXCL_RELEASE] */
        return release_exclusive_word(h, kind);
    return SHL_OK;
}

static int do_is_locked(shl_lock *h)
{
    uint32_t s = atomic_load_explicit(&h->hdr->state, memory_order_seq_cst);
    if (owner_index(h, s) == -2)
        return SHL_ECORRUPT;
    if (s & ST_GRANTED)
        return 1;
    return sum_readers(h) != 0;
}

int shl_is_locked(shl_lock *h)
{
    RUN_IN_FLIGHT(h, do_is_locked(h));
}
