{
  description = "cptest: reproducible qualification of SGLang prefill and decode context parallelism";

  # Pinned to one nixos release so that `nix develop` gives every developer the same Python and
  # libraries; flake.lock records the exact revision once `nix flake lock` can reach GitHub
  # (the CPU machines here cannot, see docs/decisions.md).
  inputs.nixpkgs.url = "github:NixOS/nixpkgs/nixos-25.05";

  outputs = { self, nixpkgs }:
    let
      systems = [ "x86_64-linux" "aarch64-linux" ];
      forAll = f: nixpkgs.lib.genAttrs systems (system: f nixpkgs.legacyPackages.${system});
      pythonFor = pkgs: pkgs.python311.withPackages (ps: with ps; [
        # runtime (pyproject.toml [project.dependencies])
        lark
        pydantic
        jinja2
        docker
        httpx
        psutil
        click
        numpy
        # reference engine, synthetic weights, numerics ([weights] extra)
        torch
        safetensors
        setproctitle
        # tests ([test] extra)
        pytest
        hypothesis
        transformers   # parity tests of the reference engine
      ]);
    in
    {
      devShells = forAll (pkgs: {
        default = pkgs.mkShell {
          packages = [
            (pythonFor pkgs)
            pkgs.ruff
            pkgs.git
            pkgs.podman   # a Docker-API engine for the docker launcher's tests
            pkgs.runc
          ];
          # The source tree itself is the package: no install step inside the shell.
          shellHook = ''
            export PYTHONPATH="$PWD''${PYTHONPATH:+:$PYTHONPATH}"
            echo "cptest dev shell: python -m cptest --help; python -m pytest"
          '';
        };
      });

      packages = forAll (pkgs: {
        default = (pkgs.python311Packages.buildPythonApplication {
          pname = "cptest";
          version = "0.1.0";
          pyproject = true;
          src = ./.;
          build-system = [ pkgs.python311Packages.setuptools ];
          dependencies = with pkgs.python311Packages; [ lark pydantic jinja2 docker httpx psutil click numpy ];
          doCheck = false;
        });
      });
    };
}
