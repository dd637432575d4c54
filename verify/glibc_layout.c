/*
 * glibc_layout.c - checks, against the running glibc and kernel, the places
 * in a pthread_mutex_t that the core reads without an API.
 *
 * slots.c reads two glibc-private fields of the slot mutexes: the lock word
 * (mutex_word: the robust-futex word, holding the owner's TID and the
 * kernel's FUTEX_WAITERS / FUTEX_OWNER_DIED bits) and the kind
 * (slot_mutex_sane).  layouts.c and info.c read a slot as "the mutex, then
 * the owner's pid".  slots.c's static asserts only compare the core with
 * the headers it was compiled against; this program compares it with what
 * glibc and the kernel do on this machine (tests/test_glibc_layout.py runs
 * it on x86-64 and, in .ci/arm64, on aarch64):
 *
 *   1. Locked, the word at the core's offset holds this thread's TID; with
 *      a second thread blocked, TID | FUTEX_WAITERS, and no other word of
 *      the mutex does: it is the futex glibc sleeps on.
 *   2. The kernel's robust list (get_robust_list) names that same word: it
 *      is the one the kernel marks when the owner dies.  And a child that
 *      dies holding the mutex leaves FUTEX_OWNER_DIED there, and the core's
 *      probe (trylock) gets EOWNERDEAD.  Both need robust futexes; where
 *      the kernel has none (qemu-user: ENOSYS) they print "skip" with the
 *      errno, and the test requires them wherever its own probe finds them.
 *   3. Only the slot mutex's kind (robust, process-shared) is sane to the
 *      core, not a default, recursive, robust-private or shared-non-robust
 *      mutex or zeroed bytes; and initialising a slot mutex instead of a
 *      default one changes no byte outside the core's kind field.
 *   4. The layout prefix layouts.c relies on: the header's first five words
 *      and the slot's pid right after its mutex.
 *
 * Prints one line per check ("ok", "skip" or "FAIL"), exits 1 on a failure.
 */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>

static int failures;

#define CHECK(cond, ...)                                                   \
    do {                                                                   \
        int ok_ = (cond);                                                  \
        printf(ok_ ? "ok   " : "FAIL ");                                   \
        printf(__VA_ARGS__);                                               \
        printf("\n");                                                      \
        if (!ok_)                                                          \
            failures++;                                                    \
    } while (0)

static size_t word_offset(pthread_mutex_t *m) { return (size_t)((char *)mutex_word(m) - (char *)m); }

static uint32_t word_at(const pthread_mutex_t *m, size_t off)
{
    uint32_t w;
    memcpy(&w, (const char *)m + off, sizeof w);   /* a snapshot: racy reads are fine */
    return w;
}

/* The offsets of the 32-bit words of m that equal v. */
static int words_equal_to(const pthread_mutex_t *m, uint32_t v, size_t *first)
{
    int n = 0;
    for (size_t off = 0; off + 4 <= sizeof *m; off += 4)
        if (__atomic_load_n((const uint32_t *)(const void *)((const char *)m + off),
                            __ATOMIC_RELAXED) == v) {
            if (n++ == 0)
                *first = off;
        }
    return n;
}

static void *lock_and_unlock(void *arg)
{
    pthread_mutex_t *m = arg;
    if (pthread_mutex_lock(m) == 0)
        pthread_mutex_unlock(m);
    return NULL;
}

static void check_lock_word(pthread_mutex_t *m)
{
    size_t off = word_offset(m), found = 0;
    uint32_t tid = (uint32_t)syscall(SYS_gettid);
    init_slot_mutex(m);
    CHECK(word_at(m, off) == 0, "free: the word at offset %zu is 0", off);
    CHECK(pthread_mutex_lock(m) == 0, "a slot mutex locks");
    uint32_t w = word_at(m, off);
    CHECK(w == tid, "locked: the word at offset %zu holds this thread's TID %u (it holds %#x)",
          off, tid, w);
    CHECK((w & FUTEX_TID_MASK) == tid && !(w & FUTEX_OWNER_DIED),
          "locked: an observer (info.c, layouts.c) reads the owner as alive");

    /* A second thread blocks: glibc sets FUTEX_WAITERS on the word it sleeps on. */
    pthread_t t;
    CHECK(pthread_create(&t, NULL, lock_and_unlock, m) == 0, "a second thread starts");
    uint32_t want = tid | FUTEX_WAITERS;
    int64_t give_up = mono_ns() + 30LL * 1000 * 1000 * 1000;   /* emulated machines are slow */
    while (words_equal_to(m, want, &found) == 0 && mono_ns() < give_up)
        sched_yield();
    int n = words_equal_to(m, want, &found);
    CHECK(n == 1, "contended: one word of the %zu-byte mutex is TID | FUTEX_WAITERS (%#x), "
          "the futex glibc sleeps on (%d found)", sizeof *m, want, n);
    CHECK(n == 1 && found == off, "contended: it is the word at offset %zu, which the core "
          "reads (it holds %#x)", off, word_at(m, off));
    pthread_mutex_unlock(m);
    pthread_join(t, NULL);
    CHECK(word_at(m, off) == 0, "unlocked by both: the word is 0 again");
    pthread_mutex_destroy(m);
}

/* struct robust_list_head as the kernel defines it (linux/futex.h). */
static void check_kernel_robust_list(pthread_mutex_t *m)
{
    struct robust_list_head *head = NULL;
    size_t len = 0;
    if (syscall(SYS_get_robust_list, 0, &head, &len) != 0) {
        printf("skip the kernel's robust list: get_robust_list: %s\n", strerror(errno));
        return;
    }
    init_slot_mutex(m);
    pthread_mutex_lock(m);
    /* glibc puts a locked robust mutex at the head of the thread's list;
     * the kernel finds the futex word at entry + futex_offset. */
    struct robust_list *entry = head->list.next;
    char *futex = (char *)entry + head->futex_offset;
    CHECK(len == sizeof *head, "the kernel's robust list head is registered (%zu bytes)", len);
    CHECK(futex == (char *)mutex_word(m), "the kernel's robust list names the word at offset "
          "%td of the locked mutex as its futex; the core reads offset %zu",
          futex - (char *)m, word_offset(m));
    pthread_mutex_unlock(m);
    pthread_mutex_destroy(m);
}

static void check_owner_death(pthread_mutex_t *m)
{
    struct robust_list_head *head = NULL;
    size_t len = 0;
    if (syscall(SYS_get_robust_list, 0, &head, &len) != 0) {
        printf("skip a dead owner's mark: get_robust_list: %s\n", strerror(errno));
        return;
    }
    init_slot_mutex(m);
    pid_t child = fork();
    if (child == 0) {
        pthread_mutex_lock(m);
        _exit(0);                 /* dies holding it */
    }
    int status;
    waitpid(child, &status, 0);
    uint32_t w = word_at(m, word_offset(m));
    CHECK((w & FUTEX_OWNER_DIED) && (w & FUTEX_TID_MASK) == 0,
          "a dead owner (TID %d): the kernel set FUTEX_OWNER_DIED and cleared the TID in "
          "the word the core reads (%#x): observers read it as dead", (int)child, w);
    CHECK(slot_mutex_sane(m) && pthread_mutex_trylock(m) == EOWNERDEAD,
          "a dead owner: the core's probe (trylock) gets EOWNERDEAD");
    pthread_mutex_consistent(m);
    pthread_mutex_unlock(m);
    pthread_mutex_destroy(m);
}

static void init_with(pthread_mutex_t *m, int type, int pshared, int robust)
{
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_settype(&a, type);
    pthread_mutexattr_setpshared(&a, pshared);
    pthread_mutexattr_setrobust(&a, robust);
    memset(m, 0, sizeof *m);
    pthread_mutex_init(m, &a);
    pthread_mutexattr_destroy(&a);
}

static void check_kind(void)
{
    size_t kind_off = offsetof(pthread_mutex_t, __data.__kind);
    pthread_mutex_t slot, other, zero;
    memset(&slot, 0, sizeof slot);
    init_slot_mutex(&slot);
    CHECK(slot_mutex_sane(&slot), "a slot mutex is sane to the core (kind %d at offset %zu)",
          slot.__data.__kind, kind_off);
    static const struct { const char *what; int type, pshared, robust; } others[] = {
        {"a default mutex", PTHREAD_MUTEX_DEFAULT, PTHREAD_PROCESS_PRIVATE, PTHREAD_MUTEX_STALLED},
        {"a recursive mutex", PTHREAD_MUTEX_RECURSIVE, PTHREAD_PROCESS_PRIVATE,
         PTHREAD_MUTEX_STALLED},
        {"a robust private mutex", PTHREAD_MUTEX_DEFAULT, PTHREAD_PROCESS_PRIVATE,
         PTHREAD_MUTEX_ROBUST},
        {"a shared non-robust mutex", PTHREAD_MUTEX_DEFAULT, PTHREAD_PROCESS_SHARED,
         PTHREAD_MUTEX_STALLED},
    };
    for (size_t i = 0; i < sizeof others / sizeof others[0]; i++) {
        init_with(&other, others[i].type, others[i].pshared, others[i].robust);
        CHECK(!slot_mutex_sane(&other), "%s is not sane to the core", others[i].what);
        pthread_mutex_destroy(&other);
    }
    memset(&zero, 0, sizeof zero);
    CHECK(!slot_mutex_sane(&zero), "zeroed bytes (a fresh segment) are not sane to the core");

    /* Where glibc keeps the attributes: the only bytes that differ between a
     * default mutex and a slot mutex lie in the core's kind field. */
    init_with(&other, PTHREAD_MUTEX_DEFAULT, PTHREAD_PROCESS_PRIVATE, PTHREAD_MUTEX_STALLED);
    int outside = 0, inside = 0;
    for (size_t b = 0; b < sizeof slot; b++) {
        if (((unsigned char *)&slot)[b] == ((unsigned char *)&other)[b])
            continue;
        if (b >= kind_off && b < kind_off + sizeof(int))
            inside++;
        else
            outside++;
    }
    CHECK(inside > 0 && outside == 0, "a slot mutex differs from a default one in the kind "
          "field only (%d bytes inside, %d outside)", inside, outside);
}

static void check_prefix(void)
{
    CHECK(offsetof(struct shl_header, magic) == 0 && offsetof(struct shl_header, layout_version) == 4 &&
          offsetof(struct shl_header, header_size) == 8 && offsetof(struct shl_header, slot_size) == 12 &&
          offsetof(struct shl_header, max_processes) == 16,
          "the header starts with magic, layout_version, header_size, slot_size, max_processes");
    CHECK(offsetof(struct shl_slot, owner) == 0 &&
          offsetof(struct shl_slot, pid) == sizeof(pthread_mutex_t),
          "a slot is its mutex (%zu bytes), then the owner's pid at offset %zu",
          sizeof(pthread_mutex_t), offsetof(struct shl_slot, pid));
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    /* Shared memory, as the slots are (the death check forks). */
    pthread_mutex_t *m = mmap(NULL, sizeof *m, PROT_READ | PROT_WRITE,
                              MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) {
        perror("mmap");
        return 2;
    }
#if defined(__x86_64__)
    printf("arch x86_64\n");
#elif defined(__aarch64__)
    printf("arch aarch64\n");
#else
    printf("arch other\n");
#endif
    printf("glibc %d.%d, pthread_mutex_t %zu bytes\n", __GLIBC__, __GLIBC_MINOR__,
           sizeof(pthread_mutex_t));
    check_lock_word(m);
    check_kernel_robust_list(m);
    check_owner_death(m);
    check_kind();
    check_prefix();
    printf("%d failed\n", failures);
    return failures ? 1 : 0;
}
