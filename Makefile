# The front door. `make train` and `make test` install what is missing
# (Debian packages), configure and build with CMake, then train or test.
BUILD ?= build
JOBS ?= $(shell nproc)
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
# libopenblas0-pthread: the BLAS Debian's PyTorch recommends; without it
# torch falls back to the netlib reference BLAS (~40x slower matmul), which
# would make every PyTorch baseline and parity run needlessly slow.
PACKAGES := cmake gcc g++ make libdnnl-dev zlib1g-dev libpng-dev libjpeg-dev libopenmpi-dev openmpi-bin valgrind pkgconf \
            python3-torch python3-torchvision python3-numpy libopenblas0-pthread dataset-fashion-mnist
CMAKE_FLAGS ?=
# make install PREFIX=DIR: the command, libctrain.so and .a, the headers,
# ctrain.pc and the CMake package under DIR (docs/INSTALL.md).
PREFIX ?= /usr/local

.PHONY: all deps build train test test-fast bench install deb clean

all: build

# Installs only what is missing: dpkg-query is cheap, apt-get is not.
deps:
	@missing=""; for p in $(PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing >/dev/null; \
	fi

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

build: deps $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

train: build
	$(BUILD)/ctrain train --model convnet --data fashion-mnist --epochs 4 --batch-size 128 --optimizer adam --lr 0.001 --scheduler cosine

test: build
	cd $(BUILD) && ctest --output-on-failure -j 2

test-fast: build
	cd $(BUILD) && ctest --output-on-failure -j 2 -LE "slow|gpu"

bench: build
	bench/run.sh

install: build
	cmake --install $(BUILD) --prefix $(PREFIX)

deb: build
	cd $(BUILD) && cpack -G DEB

clean:
	rm -rf $(BUILD)
