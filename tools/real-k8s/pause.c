// The pod sandbox's process for the real-k8s harness (the pause image): waits until a signal asks it to end,
// and reaps children it inherits.
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void on_stop(int sig) { _exit(128 + sig); }
static void on_child(int sig) {
  (void)sig;
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
}

int main(void) {
  signal(SIGINT, on_stop);
  signal(SIGTERM, on_stop);
  signal(SIGCHLD, on_child);
  for (;;) pause();
}
