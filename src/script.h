/* The limits script (scripts/ *.lua concatenated), embedded at build time. */
#ifndef SCRIPT_H
#define SCRIPT_H

extern const char script_source[];

#endif
